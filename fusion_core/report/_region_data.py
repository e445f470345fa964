"""Region pictures as plain data: drawn where the model is, shown where it is not.

The worker's sandbox has the models; the dashboard must not load them (a 200 MB graph
parsed in the API process, issue 15). So the sandbox writes each pictured fusion's
nodes and their direct neighbours (names, op types, value names, key attributes, and
the shapes of their values: at most a few dozen nodes a region) to ``regions.json``,
and the dashboard draws the SVG from that with the same layout and escaping as the HTML
report. The data is read back as untrusted input: anything that is not the shape
written here is dropped, never drawn.

Which fusions are pictured: a few examples of every pattern (``example_fusions``), not
the first fusions of the model, which in a deep network are all of one pattern.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from autofusion.fusion_core.report._graph import GraphIndex, region_svg
from autofusion.fusion_core.report._provenance import final_nodes

if TYPE_CHECKING:  # the dashboard draws from data and loads no onnx; the sandbox has it
    import onnx

__all__ = [
    "EXAMPLES_PER_PATTERN",
    "MAX_REGION_PICTURES",
    "example_fusions",
    "region_data",
    "region_pictures",
    "regions_from_data",
    "with_shapes",
]

logger = logging.getLogger(__name__)

MAX_REGION_PICTURES = 50
EXAMPLES_PER_PATTERN = 3
_MAX_NODES = 64  # a region and its neighbours; more is not data this module wrote
_MAX_TEXT = 512
_MAX_ATTRS = 8
_LABEL = re.compile(r"#(\d+) (.+)")


def example_fusions(
    applied: Sequence[dict[str, Any]],
    *,
    per_pattern: int = EXAMPLES_PER_PATTERN,
    limit: int = MAX_REGION_PICTURES,
) -> list[dict[str, Any]]:
    """The fusions to picture: the first ``per_pattern`` of each pattern, patterns by
    count (most first), at most ``limit`` in all; when that cuts, every pattern keeps
    its first example before any gets a second."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for position, fusion in enumerate(applied):
        fusion = {"index": position, **fusion}
        groups.setdefault(str(fusion.get("pattern")), []).append(fusion)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), str(g[0].get("pattern"))))
    chosen: list[dict[str, Any]] = []
    for rank in range(per_pattern):
        chosen += [group[rank] for group in ordered if rank < len(group)]
    rank = {str(group[0].get("pattern")): n for n, group in enumerate(ordered)}
    return sorted(chosen[:limit], key=lambda f: (rank[str(f.get("pattern"))], f["index"]))


def with_shapes(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with onnx's shape inference run on it, so the pictures show the shapes
    of intermediate values; the model as it is when inference fails."""
    import onnx.shape_inference  # see TYPE_CHECKING above

    try:
        return onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # a picture without shapes is still a picture
        logger.info("no shapes for the region pictures: %s", exc)
        return model


def region_pictures(
    applied: Sequence[dict[str, Any]], original: onnx.ModelProto, fused: onnx.ModelProto
) -> dict[str, Any]:
    """``regions.json``: the regions of ``example_fusions(applied)`` before (in
    ``original``) and after (in ``fused``), as node data."""
    before, after = GraphIndex(with_shapes(original)), GraphIndex(with_shapes(fused))
    regions = []
    for fusion in example_fusions(applied):
        index = fusion["index"]
        names = (fusion.get("provenance") or {}).get("original_nodes") or fusion.get(
            "replaced_nodes", []
        )
        regions.append(
            {
                "label": f"#{index} {fusion.get('pattern')}",
                "index": index,
                "pattern": str(fusion.get("pattern")),
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
    values = {v for n in nodes for v in (*n.inputs, *n.outputs)}
    return {
        "nodes": [
            {
                "name": n.name,
                "op": n.op,
                "inputs": list(n.inputs),
                "outputs": list(n.outputs),
                "in_region": n.key in region,
                "attrs": list(n.attrs),
            }
            for n in nodes
        ],
        "shapes": {v: index.shapes[v] for v in sorted(values) if v in index.shapes},
    }


def regions_from_data(data: Any) -> list[dict[str, Any]]:
    """Labels, fusion indices, patterns and SVGs (``before``/``after``, None where not
    drawable) from ``regions.json``; malformed entries are skipped. Data written before
    ``index`` and ``pattern`` were has them read from the label (``#3 conv_bn``)."""
    entries = data.get("regions") if isinstance(data, dict) else None
    drawn = []
    for entry in entries[:MAX_REGION_PICTURES] if isinstance(entries, list) else []:
        if not isinstance(entry, dict) or not _text(entry.get("label")):
            continue
        label = entry["label"]
        parsed = _LABEL.fullmatch(label)
        index, pattern = entry.get("index"), entry.get("pattern")
        if not (isinstance(index, int) and not isinstance(index, bool) and _text(pattern)):
            index, pattern = (int(parsed[1]), parsed[2]) if parsed else (None, None)
        drawn.append(
            {
                "label": label,
                "index": index,
                "pattern": pattern,
                "before": _svg(entry.get("before"), f"{label}: before"),
                "after": _svg(entry.get("after"), f"{label}: after"),
            }
        )
    return drawn


def _svg(data: Any, title: str) -> str | None:
    nodes = data.get("nodes") if isinstance(data, dict) else None
    if not isinstance(nodes, list) or not 0 < len(nodes) <= _MAX_NODES:
        return None
    shapes = data.get("shapes", {})
    if not all(_node(n) for n in nodes) or not _shapes(shapes):
        return None
    index = GraphIndex.from_nodes(
        [(n["name"], n["op"], n["inputs"], n["outputs"], n.get("attrs", [])) for n in nodes],
        shapes,
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
        and _texts(node.get("attrs", []), _MAX_ATTRS)
    )  # fmt: skip


def _shapes(shapes: Any) -> bool:
    return (
        isinstance(shapes, dict)
        and len(shapes) <= 8 * _MAX_NODES
        and all(_text(k) and _text(v) for k, v in shapes.items())
    )


def _texts(values: Any, limit: int) -> bool:
    return isinstance(values, list) and len(values) <= limit and all(_text(v) for v in values)


def _text(value: Any, *, empty: bool = False) -> bool:
    return isinstance(value, str) and (empty or bool(value)) and len(value) <= _MAX_TEXT
