"""Rules for projections that hold several things per head: slice before the head layout.

One fused ``query_key_value`` projection is split into q, k and v in two ways, and
neither is the ``Transpose(Reshape(x, [B, S, N, H]))`` of one projection that the
attention and rotary patterns read:

* ``slice_before_transpose``: GPT-NeoX puts each head's q, k and v side by side
  (``[B, S, N, 3 * H]``), transposes, then slices the last axis. A Slice of the last axis
  commutes with a Transpose that keeps the last axis last, so
  ``Slice(Transpose(y, [0, 2, 1, 3]), axis 3)`` becomes
  ``Transpose(Slice(y, axis 3), [0, 2, 1, 3])``; ``head_split`` then merges the slice.
* ``heads_by_slice``: Falcon's multi-query projection is ``N + 2`` heads, sliced on the
  heads axis (``Slice`` for the queries, ``Gather`` of one index for the key and the
  value). Heads ``a`` to ``b`` of ``Reshape(x, [B, S, M, H])`` are the last-axis slice
  ``x[..., a * H : b * H]`` reshaped to ``b - a`` heads, so the slice moves before the
  Reshape and each part becomes a head split of its own.

Neither changes a value: both pick the same elements in the same order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s, replace
from autofusion.fusion_core.ir import constant_array

__all__ = ["heads_by_slice", "slice_before_transpose"]

_HEAD_PERM = [0, 2, 1, 3]
_ONNX = ("", "ai.onnx")
_SLICE_INPUTS = 10  # the opset from which Slice reads starts, ends and axes as inputs


def slice_before_transpose(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Move every last-axis Slice or Split of a head Transpose above it; how many moved."""
    moved = 0
    for node in list(graph):
        if node.graph is not graph:
            continue  # removed by an earlier step of this sweep
        transpose = _head_transpose_of_last_axis_slice(node)
        if transpose is None or any(v.is_graph_output() for v in node.outputs):
            continue
        source = transpose.inputs[0]
        early = ir.Node(
            "",
            node.op_type,
            [source, *node.inputs[1:]],
            [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()],
            num_outputs=len(node.outputs),
            name=fresh_name(f"{_hint(node)}_early"),
        )
        new = [early]
        for part, old in zip(early.outputs, node.outputs, strict=True):
            dims = list(source.shape)  # type: ignore[arg-type]
            dims[3] = old.shape[3] if old.shape is not None else None
            _describe(part, dims, source, fresh_name(f"{_hint(node)}_early"))
            layout = ir.Node(
                "",
                "Transpose",
                [part],
                [ir.AttrInt64s("perm", _HEAD_PERM)],
                name=fresh_name(f"{_hint(node)}_heads"),
            )
            _describe(layout.outputs[0], _dims(old), source, fresh_name(old.name or "heads"))
            new.append(layout)
        replace(graph, node, new, mark, "slice_before_transpose")
        if not transpose.outputs[0].uses():  # its last slice moved: nothing reads it
            graph.remove(transpose, safe=True)
        moved += 1
    return moved


def heads_by_slice(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Turn every constant slice of heads of a head split into a head split of its own."""
    moved = 0
    if graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0)) < _SLICE_INPUTS:
        return 0  # the Slice it writes takes its bounds as inputs
    for node in list(graph):
        found = _heads_slice(node)
        if found is None or node.outputs[0].is_graph_output():
            continue
        split, first, last, keep_axis = found
        flat = split.inputs[0]
        size = split.outputs[0].shape[3]  # type: ignore[index]
        bounds = [
            int64s(graph, fresh_name, values) for values in ([first * size], [last * size], [-1])
        ]
        sliced = ir.Node("", "Slice", [flat, *bounds], name=fresh_name(f"{_hint(node)}_flat"))
        flat_dims = [*list(flat.shape)[:2], (last - first) * size]  # type: ignore[arg-type]
        _describe(sliced.outputs[0], flat_dims, flat, fresh_name(f"{_hint(node)}_flat"))
        new = [sliced]
        if keep_axis:
            target = int64s(graph, fresh_name, [0, 0, last - first, size])
            heads = ir.Node(
                "", "Reshape", [sliced.outputs[0], target], name=fresh_name(f"{_hint(node)}_split")
            )
            name = fresh_name(node.outputs[0].name or _hint(node))
            _describe(heads.outputs[0], list(node.outputs[0].shape), flat, name)
            new.append(heads)
        replace(graph, node, new, mark, "heads_by_slice")
        moved += 1
    return moved


def _head_transpose_of_last_axis_slice(node: ir.Node) -> ir.Node | None:
    """The head Transpose ``node`` slices on the last axis, where that Transpose lays out
    a head split (a Reshape of a rank-3 projection) and only slices read it, none of
    them joined back as it is: a fused projection's parts, not a rotary embedding's
    halves of one (those read the whole head too) nor its passed-through features."""
    if not _last_axis_slice(node) or node.inputs[0] is None:
        return None
    producer = node.inputs[0].producer()
    if producer is None or producer.op_type != "Transpose" or producer.domain not in _ONNX:
        return None
    perm = producer.attributes.get("perm")
    if perm is None or list(perm.value) != _HEAD_PERM:
        return None
    split = producer.inputs[0].producer() if producer.inputs[0] is not None else None
    if split is None or split.op_type != "Reshape" or not _rank(split.inputs[0], 3):
        return None
    readers = [use.node for use in producer.outputs[0].uses()]
    if not all(_last_axis_slice(r) for r in readers) or not _rank(producer.inputs[0], 4):
        return None
    if any(_joined_again(r) for r in readers):
        return None
    return producer


def _joined_again(node: ir.Node) -> bool:
    """Whether a part is concatenated back on the last axis as it is: the features a
    partial rotary embedding passes through (Phi's ``cat((q_rot, q_pass), -1)``), which
    the partial rotary pattern reads on the whole head, not a separate q, k or v."""
    for out in node.outputs:
        for use in out.uses():
            reader = use.node
            if reader.op_type == "Concat" and reader.domain in _ONNX:
                axis = reader.attributes.get("axis")
                if axis is not None and axis.value in (3, -1):
                    return True
    return False


def _last_axis_slice(node: ir.Node) -> bool:
    """A Slice (bounds as inputs) or a Split of the last axis of a rank-4 value."""
    if node.op_type == "Split" and node.domain in _ONNX:
        axis = node.attributes.get("axis")
        return axis is not None and axis.value in (3, -1)
    if node.op_type != "Slice" or len(node.inputs) < 4:
        return False
    axes = constant_array(node.inputs[3])
    return axes is not None and axes.reshape(-1).tolist() in ([3], [-1])


def _dims(value: ir.Value) -> list:
    return list(value.shape) if value.shape is not None else [None] * 4


def _rank(value: ir.Value | None, rank: int) -> bool:
    return value is not None and value.shape is not None and len(value.shape) == rank


def _heads_slice(node: ir.Node) -> tuple[ir.Node, int, int, bool] | None:
    """(the head split, first head, last head + 1, whether the heads axis stays), for a
    Slice of constant heads with step 1 or a Gather of constant contiguous heads."""
    if node.op_type not in ("Slice", "Gather") or node.inputs[0] is None:
        return None
    if node.op_type == "Slice" and len(node.inputs) < 4:
        return None
    split = node.inputs[0].producer()
    if split is None or split.op_type != "Reshape" or node.outputs[0].shape is None:
        return None
    flat, out = split.inputs[0], split.outputs[0]
    if flat is None or flat.shape is None or len(flat.shape) != 3 or out.shape is None:
        return None
    if len(out.shape) != 4 or not all(isinstance(d, int) for d in list(out.shape)[2:]):
        return None
    heads = out.shape[2]
    span = _slice_span(node, heads) if node.op_type == "Slice" else _gather_span(node, heads)
    if span is None:
        return None
    first, last, keep_axis = span
    return (split, first, last, keep_axis) if 0 <= first < last <= heads else None


def _slice_span(node: ir.Node, heads: int) -> tuple[int, int, bool] | None:
    arrays = [constant_array(v) for v in node.inputs[1:4]]
    steps = constant_array(node.inputs[4]) if len(node.inputs) > 4 else np.ones(1, np.int64)
    if any(a is None or a.size != 1 for a in arrays) or steps is None or steps.size != 1:
        return None
    starts, ends, axes = (int(a.reshape(-1)[0]) for a in arrays)  # type: ignore[union-attr]
    if axes not in (2, -2) or int(steps.reshape(-1)[0]) != 1:
        return None
    first = min(max(starts + heads if starts < 0 else starts, 0), heads)
    last = min(max(ends + heads if ends < 0 else ends, 0), heads)
    return first, last, True


def _gather_span(node: ir.Node, heads: int) -> tuple[int, int, bool] | None:
    axis = node.attributes.get("axis")
    indices = constant_array(node.inputs[1])
    if axis is None or axis.value not in (2, -2) or indices is None or indices.ndim > 1:
        return None
    picked = [int(i) + heads if i < 0 else int(i) for i in indices.reshape(-1)]
    if not picked or picked != list(range(picked[0], picked[0] + len(picked))):
        return None
    return picked[0], picked[-1] + 1, indices.ndim == 1


def _hint(node: ir.Node) -> str:
    """A name to derive new names from: exporters' nodes may have none."""
    return node.name or f"canonical_{node.op_type}"


def _describe(value: ir.Value, dims: list, like: ir.Value, name: str) -> None:
    value.shape, value.dtype, value.name = ir.Shape(dims), like.dtype, name
