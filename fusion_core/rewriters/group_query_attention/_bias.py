"""What GroupQueryAttention takes besides q, k, v and the cache, built once for all
layers where their shapes agree: the bias from the graph's mask, the rows to keep, and
the sequence lengths.

Every layer of an export slices the model's one mask to its key length (optimum:
``Slice(mask, 0, Shape(K)[2], axis 3)``), a Slice that keeps the whole mask; so the bias
``Where(allowed, 0, lowest)`` and the keep-rows factor are built from the unsliced mask
and shared by the layers (``_shared``), as are the lengths for the same symbolic batch,
sequence and past dimensions.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from fusion_core.ir import constant_array
from fusion_core.rewriters._base import RewriteContext
from fusion_core.rewriters._shape_values import known_dims
from fusion_core.rewriters._shared import mark_shared, shared_value
from fusion_core.rewriters.group_query_attention._inputs import KVSide

__all__ = ["lengths_of", "shared_bias"]


def shared_bias(
    mask: ir.Value, allowed: ir.Value, ctx: RewriteContext
) -> tuple[ir.Value, ir.Value | None, list[ir.Node]] | None:
    """(bias, rows to keep or None, new nodes) for ``mask = Where(allowed, 0, negative)``:
    the negative value made finite (float32's lowest for -inf), and where it was -inf
    the ``[B, S, 1]`` factor that is 1 where a row may attend to something. None when
    ``allowed`` is not ``[B or 1, 1, S, L]`` (one row per batch for every head)."""
    root = _unsliced(allowed)
    dims = known_dims(root)
    if dims is None or len(dims) != 4 or dims[1] != 1:
        return None
    negative = constant_array(mask.producer().inputs[2])  # type: ignore[union-attr]
    assert negative is not None
    infinite = bool(np.any(np.isneginf(negative)))
    value = float(np.finfo(np.float32).min) if infinite else float(negative.reshape(-1)[0])
    nodes: list[ir.Node] = []
    key = f"gqa_bias:{root.name}:{value!r}"
    bias = shared_value(ctx.graph, key)
    if bias is None:
        zero = ctx.initializer("gqa_attend", np.array(0.0, np.float32))
        lowest = ctx.initializer("gqa_masked", np.array(value, np.float32))
        nodes.append(ir.Node("", "Where", [root, zero, lowest]))
        mark_shared(nodes[-1], key)
        bias = nodes[-1].outputs[0]
        bias.dtype = ir.DataType.FLOAT
    if not infinite:
        return bias, None, nodes
    return bias, _keep_rows(root, ctx, nodes), nodes


def _unsliced(allowed: ir.Value) -> ir.Value:
    """``allowed`` before Slices that keep its whole shape (known, equal dims)."""
    for _ in range(4):
        producer = allowed.producer()
        if producer is None or producer.op_type != "Slice":
            break
        before, after = known_dims(producer.inputs[0]), known_dims(allowed)
        if before is None or before != after or None in before:
            break
        allowed = producer.inputs[0]
    return allowed


def _keep_rows(root: ir.Value, ctx: RewriteContext, nodes: list[ir.Node]) -> ir.Value:
    """``[B, S, 1]``: 1 where the row attends to something (shared per mask)."""
    key = f"gqa_keep_rows:{root.name}"
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
    cast = ir.Node("", "Cast", [root], [ir.AttrInt64("to", ir.DataType.FLOAT)])
    axes = ctx.initializer("gqa_key_axis", np.array([3], np.int64))
    if ctx.opset >= 18:
        reduce = ir.Node("", "ReduceMax", [cast.outputs[0], axes], [ir.AttrInt64("keepdims", 0)])
    else:
        attrs = [ir.AttrInt64s("axes", [3]), ir.AttrInt64("keepdims", 0)]
        reduce = ir.Node("", "ReduceMax", [cast.outputs[0]], attrs)
    rows = ir.Node("", "Transpose", [reduce.outputs[0]], [ir.AttrInt64s("perm", [0, 2, 1])])
    mark_shared(rows, key)
    nodes += [cast, reduce, rows]
    rows.outputs[0].dtype = ir.DataType.FLOAT
    return rows.outputs[0]


def lengths_of(
    q: ir.Value, key: KVSide, ctx: RewriteContext, nodes: list[ir.Node]
) -> list[ir.Value]:
    """``seqlens_k`` ([B] int32: every key row is valid, L - 1), ``total_sequence_length``
    (scalar int32 L) and ``query_seqlens`` ([B] int32 S), L = past length + S; shared
    by the layers whose batch, sequence and past dimensions are the same symbols."""
    dims = (known_dims(q) or [None])[0], (known_dims(key.new) or [None, None])[1]
    past = (known_dims(key.past) or [None] * 3)[2] if key.past is not None else 0
    shared_key = f"gqa_lengths:{dims[0]}:{dims[1]}:{past}" if None not in (*dims, past) else None
    if shared_key is not None:
        found = [shared_value(ctx.graph, f"{shared_key}:{i}") for i in range(3)]
        if all(v is not None for v in found):
            return found  # type: ignore[return-value]
    values = _lengths(q, key, ctx, nodes)
    if shared_key is not None:
        for i, value in enumerate(values):
            producer = value.producer()
            assert producer is not None
            mark_shared(producer, f"{shared_key}:{i}")
    return values


def _lengths(q: ir.Value, key: KVSide, ctx: RewriteContext, nodes: list[ir.Node]) -> list[ir.Value]:
    def shape(value: ir.Value, start: int) -> ir.Value:
        attrs = [ir.AttrInt64("start", start), ir.AttrInt64("end", start + 1)]
        nodes.append(ir.Node("", "Shape", [value], attrs))
        return nodes[-1].outputs[0]

    def add(op: str, inputs: list[ir.Value | None], attrs: list[ir.Attr] = ()) -> ir.Value:
        nodes.append(ir.Node("", op, inputs, list(attrs)))
        return nodes[-1].outputs[0]

    def to_int32(value: ir.Value) -> ir.Value:
        return add("Cast", [value], [ir.AttrInt64("to", ir.DataType.INT32)])

    sequence = shape(key.new, 1)
    total = sequence if key.past is None else add("Add", [shape(key.past, 2), sequence])
    batch = shape(q, 0)
    one = ctx.initializer("gqa_one", np.array([1], np.int64))
    scalar_shape = ctx.initializer("gqa_scalar_shape", np.array([], np.int64))
    seqlens = add("Expand", [to_int32(add("Sub", [total, one])), batch])
    total_length = to_int32(add("Reshape", [total, scalar_shape]))
    query_seqlens = add("Expand", [to_int32(sequence), batch])
    for value in (seqlens, total_length, query_seqlens):
        value.dtype = ir.DataType.INT32
    return [seqlens, total_length, query_seqlens]
