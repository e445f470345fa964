"""The inputs of the fused rotary op made from its angles (``_rotary_tables``'s
``AngleTable``): the ``[max_positions, r / 2]`` cos and sin caches (``angle_cache``;
one per distinct table, read by every layer: a constant one is named by its content)
and the position ids (``rotary_positions``; RoFormer's ``Range(0, S)`` is the op's
offset ``[0]`` on onnxruntime, so no layer builds ``[B, S]`` ids).
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.rewriters._rotary_tables import AngleTable
from autofusion.fusion_core.rewriters._shared import mark_shared, shared_value
from autofusion.fusion_core.sizes import scalar

__all__ = ["angle_cache", "rotary_positions"]


def angle_cache(
    table: AngleTable,
    rotary_dim: int,
    ctx: RewriteContext,
    nodes: list[ir.Node],
    dtype: ir.DataType | None,
) -> ir.Value:
    """``[rows, r / 2]``: the first half of the table, one row per position, in ``dtype``
    (the rotated input's: the op takes x and its caches in one type, float or float16)."""
    dtype = dtype or ir.DataType.FLOAT
    if table.table is not None:
        cache = table.table.astype(dtype.numpy())
        # named by what it holds, not by the value it was read from: layers that cut
        # their parts of one table each (TorchScript's chunk per layer) read one cache
        digest = hashlib.sha256(cache.tobytes() + repr(cache.shape).encode()).hexdigest()
        name = f"rotary_cache_{dtype.name.lower()}_{digest[:16]}"
        made = ctx.graph.initializers.get(name)  # an earlier rotary's (another layer's)
        held = constant_array(made) if made is not None else None
        if held is not None and held.dtype == cache.dtype and np.array_equal(held, cache):
            return made  # type: ignore[return-value]
        return ctx.initializer(name, cache)
    key = f"rotary_cache:{table.value.name}:{dtype.name}"
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
    half = rotary_dim // 2
    shape = ctx.initializer("rotary_rows", np.array([-1, half], np.int64))
    if table.half:
        first = None
        flat = ir.Node("", "Reshape", [table.value, shape])
    elif table.pairs:  # one entry of each repeated pair: t[..., 0:r:2]
        bounds = [
            ctx.initializer(name, np.array([value], np.int64))
            for name, value in (
                ("rotary_zero", 0),
                (f"rotary_dim_{rotary_dim}", rotary_dim),
                ("rotary_last_axis", -1),
                ("rotary_two", 2),
            )
        ]
        first = ir.Node("", "Slice", [table.value, *bounds])
        flat = ir.Node("", "Reshape", [first.outputs[0], shape])
    else:
        starts = ctx.initializer("rotary_zero", np.array([0], np.int64))
        ends = ctx.initializer("rotary_half", np.array([half], np.int64))
        axes = ctx.initializer("rotary_last_axis", np.array([-1], np.int64))
        first = ir.Node("", "Slice", [table.value, starts, ends, axes])
        flat = ir.Node("", "Reshape", [first.outputs[0], shape])
    flat.outputs[0].dtype = table.value.dtype
    nodes += [n for n in (first, flat) if n is not None]
    if table.value.dtype != dtype:  # angles computed in another type than x (a Cast after)
        nodes.append(ir.Node("", "Cast", [flat.outputs[0]], [ir.AttrInt64("to", dtype)]))
        nodes[-1].outputs[0].dtype = dtype
    mark_shared(nodes[-1], key)
    return nodes[-1].outputs[0]


def rotary_positions(
    table: AngleTable, x: ir.Value, contrib: bool, ctx: RewriteContext, nodes: list[ir.Node]
) -> ir.Value:
    """The cache row of each (batch, position): the table's ids, ``b * S + s``, or
    ``[0]`` (row ``s`` for every batch) where onnxruntime takes that form: a table that
    does not depend on the batch, or ids ``Range(0, S)``."""
    if table.ids is not None and contrib and _counts_from_zero(table.ids):
        # RoFormer's Range(0, S): row s for every batch, the op's one-element offset,
        # so no rotary builds [B, S] position ids of its own (exact: the same rows)
        return _offset(ctx)
    if table.ids is not None:
        ids = table.ids
        if ids.dtype != ir.DataType.INT64:
            nodes.append(ir.Node("", "Cast", [ids], [ir.AttrInt64("to", ir.DataType.INT64)]))
            ids = nodes[-1].outputs[0]
        if ids.shape is not None and len(ids.shape) == 1:  # [S], one for every batch
            return _ids_for_every_batch(ids, x, ctx, nodes)
        return ids
    if not table.batched and contrib:
        return _offset(ctx)
    if table.table is not None:  # a folded table: row s for every batch of x
        return _rows_for_every_batch(table.table.shape[0], x, ctx, nodes)
    key = f"rotary_positions:{table.value.name}" + ("" if table.batched else f":{x.name}")
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
    if table.value.shape is not None and len(table.value.shape) == 2:  # [S, r]: no batch axis
        positions = _ids_for_every_batch(_sequence(table.value, ctx, nodes), x, ctx, nodes)
        mark_shared(nodes[-1], key)
        return positions
    batch_and_sequence = ir.Node(
        "", "Shape", [table.value], [ir.AttrInt64("start", 0), ir.AttrInt64("end", 2)]
    )
    nodes.append(batch_and_sequence)
    rows = ir.Node("", "ReduceProd", [batch_and_sequence.outputs[0]], [ir.AttrInt64("keepdims", 0)])
    zero = ctx.initializer("rotary_first_row", np.array(0, np.int64))
    one = ctx.initializer("rotary_step", np.array(1, np.int64))
    arange = ir.Node("", "Range", [zero, rows.outputs[0], one])
    shaped = ir.Node("", "Reshape", [arange.outputs[0], batch_and_sequence.outputs[0]])
    nodes += [rows, arange, shaped]
    if not table.batched:  # generic: [1, S] rows for every batch of x
        batch = ir.Node("", "Shape", [x], [ir.AttrInt64("start", 0), ir.AttrInt64("end", 1)])
        sequence = ir.Node(
            "", "Shape", [table.value], [ir.AttrInt64("start", 1), ir.AttrInt64("end", 2)]
        )
        target = ir.Node(
            "", "Concat", [batch.outputs[0], sequence.outputs[0]], [ir.AttrInt64("axis", 0)]
        )
        nodes += [
            batch,
            sequence,
            target,
            ir.Node("", "Expand", [shaped.outputs[0], target.outputs[0]]),
        ]
    nodes[-1].outputs[0].dtype = ir.DataType.INT64
    mark_shared(nodes[-1], key)
    return nodes[-1].outputs[0]


def _offset(ctx: RewriteContext) -> ir.Value:
    """The one-element position ids ``[0]``: an earlier rotary's, or a new one."""
    made = ctx.graph.initializers.get("rotary_offset")
    held = constant_array(made) if made is not None else None
    if held is not None and held.dtype == np.int64 and held.tolist() == [0]:
        return made  # type: ignore[return-value]
    return ctx.initializer("rotary_offset", np.array([0], np.int64))


def _counts_from_zero(ids: ir.Value) -> bool:
    """Whether ``ids`` is 1-D ``Range(0, n, 1)``: ``ids[s] = s``. Its ``n`` is the heads'
    ``S``, which the table's reader checked (``_rotary_pairs``: the ids cover the S of
    the heads), so the offset form reads the rows the ids name."""
    producer = ids.producer()
    if producer is None or producer.op_type != "Range" or producer.domain not in ("", "ai.onnx"):
        return False
    if ids.shape is None or len(ids.shape) != 1:
        return False
    return scalar(producer.inputs[0]) == 0 and scalar(producer.inputs[2]) == 1


def _rows_for_every_batch(
    rows: int, x: ir.Value, ctx: RewriteContext, nodes: list[ir.Node]
) -> ir.Value:
    """``[B, S]`` position ids ``0 .. S - 1`` for each batch of ``x`` (ONNX
    RotaryEmbedding's 2-D form)."""
    arange = ctx.initializer(f"rotary_rows_{rows}", np.arange(rows, dtype=np.int64)[None, :])
    batch = ir.Node("", "Shape", [x], [ir.AttrInt64("start", 0), ir.AttrInt64("end", 1)])
    length = ctx.initializer(f"rotary_length_{rows}", np.array([rows], np.int64))
    target = ir.Node("", "Concat", [batch.outputs[0], length], [ir.AttrInt64("axis", 0)])
    expand = ir.Node("", "Expand", [arange, target.outputs[0]])
    expand.outputs[0].dtype = ir.DataType.INT64
    nodes += [batch, target, expand]
    return expand.outputs[0]


def _ids_for_every_batch(
    ids: ir.Value, x: ir.Value, ctx: RewriteContext, nodes: list[ir.Node]
) -> ir.Value:
    """``[B, S]``: the 1-D position ids ``[S]`` (RoFormer's ``Range(0, S)``, gathered
    from one table for every batch) expanded over the batch of ``x``; both ops read
    position ids ``[B, S]``."""
    first = ctx.initializer("rotary_first_axis", np.array([0], np.int64))
    one = ctx.initializer("rotary_one", np.array([1], np.int64))
    row = ir.Node("", "Unsqueeze", [ids, first])
    batch = ir.Node("", "Shape", [x], [ir.AttrInt64("start", 0), ir.AttrInt64("end", 1)])
    target = ir.Node("", "Concat", [batch.outputs[0], one], [ir.AttrInt64("axis", 0)])
    expand = ir.Node("", "Expand", [row.outputs[0], target.outputs[0]])
    expand.outputs[0].dtype = ir.DataType.INT64
    nodes += [row, batch, target, expand]
    return expand.outputs[0]


def _sequence(table: ir.Value, ctx: RewriteContext, nodes: list[ir.Node]) -> ir.Value:
    """``Range(0, S)``: a position for each row of a ``[S, r]`` table."""
    rows = ir.Node("", "Shape", [table], [ir.AttrInt64("start", 0), ir.AttrInt64("end", 1)])
    length = ir.Node("", "ReduceProd", [rows.outputs[0]], [ir.AttrInt64("keepdims", 0)])
    zero = ctx.initializer("rotary_first_row", np.array(0, np.int64))
    one = ctx.initializer("rotary_step", np.array(1, np.int64))
    arange = ir.Node("", "Range", [zero, length.outputs[0], one])
    arange.outputs[0].dtype = ir.DataType.INT64
    nodes += [rows, length, arange]
    return arange.outputs[0]
