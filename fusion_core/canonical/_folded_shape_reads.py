"""The ``Shape`` reads of a folded product ``heads_in_batch`` unfolds (TorchScript
builds Reshape targets from them): those that only built the split's own target go with
it (a read of some axes only so); any other whole-shape read reads the unfolded
product's shape folded back, ``[B * N, S, X]`` from ``[B, N, S, X]`` (``Concat(Mul(d0,
d1), d2:4)`` of its Shape: exact)."""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s, replace

__all__ = ["dead_from", "fold_shape", "shape_reads"]

_ONNX = ("", "ai.onnx")


_SLICE_INPUTS = 10  # opset from which Slice takes its bounds as inputs
_PLUMBING_LIMIT = 24  # nodes a shape read feeds, at most, to be dropped with the split


def shape_reads(graph: ir.Graph, split: ir.Node) -> list[ir.Node]:
    """The ``Shape`` reads of the value the split unfolds, besides the split (TorchScript
    builds Reshape targets from them), from opset 10 on: whole-shape reads, and reads of
    some axes (``start``, ``end``) that feed the split's target alone (``sequence_first
    _fold``'s): those go with the split."""
    value = split.inputs[0]
    if graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0)) < _SLICE_INPUTS:
        return []
    return [
        u.node
        for u in value.uses()  # type: ignore[union-attr]
        if u.node is not split
        and u.node.op_type == "Shape"
        and u.node.domain in _ONNX
        and not u.node.outputs[0].is_graph_output()
        and (not u.node.attributes or dead_from(u.node, split))
    ]


def dead_from(read: ir.Node, until: ir.Node | None = None) -> list[ir.Node]:
    """``read`` and what it feeds, readers first, where all of it feeds nothing else (the
    target of the split just replaced; or nothing but ``until``); empty where any of it
    is still read."""
    found: dict[int, ir.Node] = {}
    pending = [read]
    while pending:
        node = pending.pop()
        if id(node) in found or node is until:
            continue
        if len(found) == _PLUMBING_LIMIT:
            return []
        found[id(node)] = node
        for out in node.outputs:
            if out.is_graph_output():
                return []
            pending += [u.node for u in out.uses()]
    order = {id(n): i for i, n in enumerate(read.graph or [])}
    return sorted(found.values(), key=lambda n: -order.get(id(n), 0))


def fold_shape(
    graph: ir.Graph,
    read: ir.Node,
    unfolded: ir.Value,
    fresh_name: Callable[[str], str],
    mark: str,
    rule: str,
) -> None:
    """``Shape(fold(y))`` as ``[B * N, S, X]`` from ``Shape(y)`` of ``y: [B, N, S, X]``."""
    shape = ir.Node("", "Shape", [unfolded])
    parts = []
    for start, end in ((0, 1), (1, 2), (2, 4)):
        bounds = [int64s(graph, fresh_name, [start]), int64s(graph, fresh_name, [end])]
        parts.append(ir.Node("", "Slice", [shape.outputs[0], *bounds]))
    rows = ir.Node("", "Mul", [parts[0].outputs[0], parts[1].outputs[0]])
    folded = ir.Node(
        "", "Concat", [rows.outputs[0], parts[2].outputs[0]], [ir.AttrInt64("axis", 0)]
    )
    nodes = [shape, *parts, rows, folded]
    for node in nodes:
        node.name = fresh_name(f"{rule}_{node.op_type}")
        node.outputs[0].name = fresh_name(f"{rule}_{node.op_type.lower()}")
    for node in nodes:
        node.outputs[0].dtype = ir.DataType.INT64
    folded.outputs[0].shape = ir.Shape([3])
    replace(graph, read, nodes, mark, rule)
