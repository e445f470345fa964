"""Where each applied fusion came from and what became of it, and its measured gain.

Fusions run in rounds, so a fusion may replace nodes an earlier fusion created (a
Conv+BN folded into a Conv then takes its activation). Following those links by node
name gives, for every fusion, the nodes of the input graph it covers in the end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["fusion_entries", "final_nodes"]


def fusion_entries(
    applied: Sequence[dict[str, Any]], profile: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """``applied`` (AppliedFusion dicts) with index, provenance and gains added."""
    regions = _regions(profile)
    producer: dict[str, int] = {}  # node name -> index of the latest fusion that made it
    entries: list[dict[str, Any]] = []
    for index, fusion in enumerate(applied):
        provenance = _provenance(fusion, entries, producer)
        for earlier in provenance["from_fusions"]:
            entries[earlier]["provenance"]["superseded_by"].append(index)
        entries.append(
            {
                **fusion,
                "index": index,
                "provenance": provenance,
                "predicted_gain": fusion.get("predicted_gain"),
                "measured_gain": _measured(fusion, regions),
            }
        )
        producer.update(dict.fromkeys(fusion["new_nodes"], index))
    return entries


def _provenance(
    fusion: dict[str, Any], entries: list[dict[str, Any]], producer: dict[str, int]
) -> dict[str, Any]:
    """Earlier fusions this one consumed, and the input-graph nodes it covers in all.

    A ``provenance`` the pipeline already recorded is kept; these keys are added.
    """
    original: list[str] = []
    for name in fusion["replaced_nodes"]:
        if name in producer:
            original += entries[producer[name]]["provenance"]["original_nodes"]
        else:
            original.append(name)
    given = fusion.get("provenance")
    return (given if isinstance(given, dict) else {}) | {
        "original_nodes": list(dict.fromkeys(original)),
        "from_fusions": sorted({producer[n] for n in fusion["replaced_nodes"] if n in producer}),
        "superseded_by": [],
    }


def final_nodes(entries: Sequence[dict[str, Any]], index: int) -> list[str]:
    """The nodes of the final model that stand for fusion ``index``'s new nodes."""
    names: list[str] = []
    for name in entries[index].get("new_nodes") or []:
        later = next(
            (j for j in range(index + 1, len(entries)) if name in entries[j]["replaced_nodes"]),
            None,
        )
        names += [name] if later is None else final_nodes(entries, later)
    return list(dict.fromkeys(names))


def _regions(profile: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The profile's regions by fused node name."""
    regions = (profile or {}).get("regions") if isinstance(profile, dict) else None
    return {
        name: region
        for region in regions or []
        if isinstance(region, dict)
        for name in region.get("fused_nodes") or []
    }


def _measured(fusion: dict[str, Any], regions: dict[str, dict[str, Any]]) -> dict | None:
    for name in fusion["new_nodes"]:
        region = regions.get(name)
        if region is None or region.get("pattern", fusion["pattern"]) != fusion["pattern"]:
            continue
        before, after = _number(region.get("before_us")), _number(region.get("after_us"))
        both = before is not None and after is not None
        return {
            "before_us": before,
            "after_us": after,
            "saved_us": round(before - after, 3) if both else None,
            "ratio": round(after / before, 4) if both and before else None,
        }
    return None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None
