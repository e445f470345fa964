"""Region pictures as plain data: drawn where the model is, shown where it is not.

The worker's sandbox has the models; the dashboard must not load them (a 200 MB graph
parsed in the API process, issue 15). So the sandbox writes each fused region's nodes
and their direct neighbours (names, op types, value names: at most a few dozen nodes a
region) to ``regions.json``, and the dashboard draws the SVG from that with the same
layout and escaping as the HTML report. The data is read back as untrusted input:
anything that is not the shape written here is dropped, never drawn.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx

from fusion_core.report._graph import GraphIndex, region_svg
from fusion_core.report._html import MAX_REGION_PICTURES
from fusion_core.report._provenance import final_nodes

__all__ = ["region_data", "region_pictures", "regions_from_data"]

_MAX_NODES = 64  # a region and its neighbours; more is not data this module wrote
_MAX_TEXT = 512


def region_pictures(
    applied: Sequence[dict[str, Any]], original: onnx.ModelProto, fused: onnx.ModelProto
) -> dict[str, Any]:
    """``regions.json``: each of the first ``MAX_REGION_PICTURES`` fusions' region before
    (in ``original``) and after (in ``fused``), as node data."""
    before, after = GraphIndex(original), GraphIndex(fused)
    regions = []
    for position, fusion in enumerate(applied[:MAX_REGION_PICTURES]):
        index = fusion.get("index", position)
        names = (fusion.get("provenance") or {}).get("original_nodes") or fusion.get(
            "replaced_nodes", []
        )
        regions.append(
            {
                "label": f"#{index} {fusion.get('pattern')}",
                "before": region_data(before, [str(n) for n in names]),
                "after": region_data(after, final_nodes(list(applied), index)),
            }
        )
    return {"regions": regions, "total": len(applied)}


def region_data(index: GraphIndex, names: Sequence[str]) -> dict[str, Any] | None:
    """The region ``names`` and its direct neighbours, or None when none is found."""
    nodes, region = index.neighbourhood(names)
    if not region:
        return None
    return {
        "nodes": [
            {
                "name": n.name,
                "op": n.op,
                "inputs": list(n.inputs),
                "outputs": list(n.outputs),
                "in_region": n.key in region,
            }
            for n in nodes
        ]
    }


def regions_from_data(data: Any) -> list[dict[str, Any]]:
    """Labels and SVGs (``before``/``after``, None where not drawable) from
    ``regions.json``; malformed entries are skipped."""
    entries = data.get("regions") if isinstance(data, dict) else None
    drawn = []
    for entry in entries[:MAX_REGION_PICTURES] if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not _text(entry.get("label")):
            continue
        label = entry["label"]
        drawn.append(
            {
                "label": label,
                "before": _svg(entry.get("before"), f"{label}: before"),
                "after": _svg(entry.get("after"), f"{label}: after"),
            }
        )
    return drawn


def _svg(data: Any, title: str) -> str | None:
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list) or not 0 < len(nodes) <= _MAX_NODES:
        return None
    if not all(_node(n) for n in nodes):
        return None
    index = GraphIndex.from_nodes(
        [(n["name"], n["op"], n["inputs"], n["outputs"]) for n in nodes]
    )
    return region_svg(index, [n["name"] for n in nodes if n["in_region"]], title)


def _node(node: Any) -> bool:
    return (
        isinstance(node, dict)
        and _text(node.get("name"), empty=True)
        and _text(node.get("op"))
        and isinstance(node.get("in_region"), bool)
        and all(
            isinstance(node.get(k), list) and len(node[k]) <= _MAX_NODES
            and all(_text(v) for v in node[k])
            for k in ("inputs", "outputs")
        )
    )  # fmt: skip


def _text(value: Any, *, empty: bool = False) -> bool:
    return isinstance(value, str) and (empty or bool(value)) and len(value) <= _MAX_TEXT
