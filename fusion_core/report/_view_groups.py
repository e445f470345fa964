"""The fusions and near misses of a report, grouped, so that a model with hundreds of
fusions makes a page of a few screens.

Fusions group by pattern (most fusions first): each group has its count and gains, the
pictured examples (``regions.json`` holds a few of each pattern: ``example_fusions``),
and every fusion as a row that names its nodes in the original model and in the fused
model, the names a graph viewer (Netron) finds them by. Near misses group by pattern,
kind and reason, the names in the reason (``'block4_y'``) set aside, so 43 times
"op.in1 (...) is not a constant initializer" is one line with a count.
"""

from __future__ import annotations

import re
from typing import Any

from markupsafe import Markup

__all__ = [
    "EXAMPLES_SHOWN",
    "MAX_ROWS",
    "OPEN_GROUPS",
    "fusion_groups",
    "near_miss_groups",
]

EXAMPLES_SHOWN = 1  # pictures open in each group; the others of regions.json fold
OPEN_GROUPS = 4  # groups beyond these start folded
MAX_ROWS = 2000  # fusions or near misses listed per group; the JSON report has them all
NEAR_MISS_EXAMPLES = 3
_QUOTED = re.compile(r"'[^']*'|\"[^\"]*\"")


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _names(value: Any) -> list[str]:
    return [str(n) for n in _list(value)]


def final_names(applied: list[dict[str, Any]]) -> list[list[str]]:
    """For each fusion, the nodes of the fused model that stand for its new nodes: a
    later fusion that replaced one of them stands in with its own (as ``final_nodes``,
    in one pass from the last fusion back)."""
    replaced_by: dict[str, list[int]] = {}
    for position, fusion in enumerate(applied):
        for name in _names(fusion.get("replaced_nodes")):
            replaced_by.setdefault(name, []).append(position)
    final: list[list[str]] = [[] for _ in applied]
    for position in range(len(applied) - 1, -1, -1):
        names: list[str] = []
        for name in _names(applied[position].get("new_nodes")):
            later = next((j for j in replaced_by.get(name, []) if j > position), None)
            names += [name] if later is None else final[later]
        final[position] = list(dict.fromkeys(names))
    return final


def _original_nodes(fusion: dict[str, Any]) -> list[str]:
    provenance = fusion.get("provenance")
    names = provenance.get("original_nodes") if isinstance(provenance, dict) else None
    return _names(names) or _names(fusion.get("replaced_nodes"))


def _pictures(regions: list[dict[str, Any]] | None) -> dict[int, dict[str, Any]]:
    # regions_from_data drew each SVG with region_svg, which escapes every name,
    # op type and title it read from the (untrusted) regions.json.
    return {
        r["index"]: {
            "before": Markup(r["before"]) if r["before"] else None,
            "after": Markup(r["after"]) if r["after"] else None,
        }
        for r in regions or []
        if isinstance(r.get("index"), int)
    }


def fusion_groups(
    applied: list[dict[str, Any]], regions: list[dict[str, Any]] | None, totals
) -> list[dict[str, Any]]:
    """One group per pattern; ``totals(gains)`` sums predicted or measured gains."""
    final = final_names(applied)
    pictures = _pictures(regions)
    groups: dict[str, list[int]] = {}
    for position, fusion in enumerate(applied):
        groups.setdefault(str(fusion.get("pattern")), []).append(position)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    result = []
    for rank, (pattern, positions) in enumerate(ordered):
        rows = [
            {
                "index": applied[p].get("index", p),
                "original": _original_nodes(applied[p]),
                "fused": final[p],
                **pictures.get(applied[p].get("index", p), {}),
            }
            for p in positions
        ]
        pictured = [row for row in rows if "before" in row]
        predicted = totals([applied[p].get("predicted_gain") for p in positions])
        measured = totals([applied[p].get("measured_gain") for p in positions])
        result.append(
            {
                "pattern": pattern,
                "slug": f"group-{rank}",
                "count": len(positions),
                "open": rank < OPEN_GROUPS,
                "examples": pictured[:EXAMPLES_SHOWN],
                "more_examples": pictured[EXAMPLES_SHOWN:],
                "rows": rows[:MAX_ROWS],
                "rows_left_out": max(len(rows) - MAX_ROWS, 0),
                "predicted_saved_us": predicted["saved"],
                "predicted_ratio": predicted["ratio"],
                "saved_us": measured["saved"],
                "ratio": measured["ratio"],
            }
        )
    return result


def reason_template(reason: str) -> str:
    """The reason with every quoted name set aside: ``op.in1 ('…') is not a constant``."""
    return _QUOTED.sub("'…'", reason)


def near_miss_groups(misses: list[Any]) -> list[dict[str, Any]]:
    """Near misses by (pattern, kind, reason template), most frequent first."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for miss in misses:
        if not isinstance(miss, dict):
            continue
        reason = str(miss.get("reason"))
        row = {"nodes": _names(miss.get("nodes")), "reason": reason}
        key = (str(miss.get("pattern")), str(miss.get("kind") or "constraint"))
        groups.setdefault((*key, reason_template(reason)), []).append(row)
    ordered = sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    return [
        {
            "pattern": pattern,
            "kind": kind,
            "reason": template,
            "count": len(rows),
            "examples": rows[:NEAR_MISS_EXAMPLES],
            "rest": rows[NEAR_MISS_EXAMPLES:MAX_ROWS],
            "rest_left_out": max(len(rows) - MAX_ROWS, 0),
        }
        for (pattern, kind, template), rows in ordered
    ]
