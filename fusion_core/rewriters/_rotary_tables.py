"""Where a rotary embedding's cos and sin come from, as the fused op reads them.

The rotary rewriter (``rotary.py``) proves the rotation; this reads its angles: a
``[Bc, S, r]`` value the graph computes (from ``inv_freq`` and the positions, halves
concatenated or repeated, or folded into the batch), or a constant table gathered by
position ids, and makes the op's inputs from it: the ``[max_positions, r / 2]`` cos and
sin caches (``angle_cache``; shared between the layers that read one table) and the
position ids (``rotary_positions``).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical import axes_of, known_dims
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.rewriters._shared import mark_shared, shared_value

__all__ = ["AngleTable", "angle_cache", "angle_table", "rotary_positions"]


class AngleTable:
    """Where a rotary angle's cosine (or sine) comes from: the ``[Bc, S, r]`` value ``c``
    computed in the graph (``batched``: ``Bc`` is the batch), or a constant table
    gathered by position ids ``ids``."""

    def __init__(
        self,
        value: ir.Value,
        batched: bool,
        table: np.ndarray | None,
        ids: ir.Value | None,
        *,
        half: bool = False,  # value is the half already ([Bc, S, r / 2]: interleaved)
        pairs: bool = False,  # value repeats each entry twice ([Bc, S, r]: Cohere, GLM)
    ):
        self.value, self.batched, self.table, self.ids = value, batched, table, ids
        self.half, self.pairs = half, pairs


def angle_table(
    value: ir.Value | None, x_dims: list, rotary_dim: int, what: str
) -> AngleTable | str:
    """The ``[Bc, S, r]`` cosine or sine behind ``Unsqueeze(c, 1)``, proven to have equal
    halves, or why not."""
    producer = value.producer() if value is not None else None
    halves = _repeated_halves(producer, x_dims, rotary_dim, what)
    if halves is not None:
        return halves
    folded = _folded_table(value, x_dims, rotary_dim, what)
    if folded is not None:
        return folded
    if producer is None or producer.op_type != "Unsqueeze" or axes_of(producer) != [1]:
        name = value.name if value is not None else None
        return (
            f"the {what} {name!r} is not Unsqueeze(c, axis 1) of a [batch, S, {rotary_dim}] table"
        )
    table = producer.inputs[0]
    dims = known_dims(table)
    if dims is None or len(dims) != 3 or dims[2] != rotary_dim:
        return f"the {what} table {table.name!r} is not known to be [batch or 1, S, {rotary_dim}]"
    if dims[1] is None or dims[1] != x_dims[2]:
        return (
            f"the {what} table {table.name!r} ({dims}) does not cover the S of the heads {x_dims}"
        )
    batched = dims[0] is not None and dims[0] == x_dims[0] and dims[0] != 1
    if dims[0] != 1 and not batched:
        return (
            f"the batch of the {what} table {table.name!r} ({dims[0]}) is neither 1 nor "
            f"that of the heads ({x_dims[0]})"
        )
    gathered = _gathered_table(table, rotary_dim)
    if gathered is not None:
        return gathered
    reason = _equal_halves(table)
    if reason is not None:
        return f"cannot show that the halves of the {what} table {table.name!r} are equal: {reason}"
    return AngleTable(table, batched, None, None)


def _repeated_halves(
    producer: ir.Node | None, x_dims: list, rotary_dim: int, what: str
) -> AngleTable | str | None:
    """``Concat(u, u, axis=-1)`` of ``u = Unsqueeze(t, 1)``, ``t`` a ``[Bc, S, r / 2]``
    table (the canonical ``rotary_halves`` repeats gpt-oss's angles so): its halves are
    equal by construction and ``t`` is the cache itself. None when not that form."""
    if producer is None or producer.op_type != "Concat" or len(producer.inputs) != 2:
        return None
    first, second = producer.inputs
    if first is None or first is not second or attribute_value(producer, "axis", 0) not in (-1, 3):
        return None
    unsqueeze = first.producer()
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or axes_of(unsqueeze) != [1]:
        return f"the {what} {first.name!r} repeated over both halves is not Unsqueeze(c, 1)"
    table = unsqueeze.inputs[0]
    dims = known_dims(table)
    if dims is None or len(dims) != 3 or dims[2] != rotary_dim // 2 or dims[1] != x_dims[2]:
        return (
            f"the {what} table {table.name!r} ({dims}) is not [batch or 1, S, {rotary_dim // 2}] "
            f"for heads {x_dims}"
        )
    batched = dims[0] is not None and dims[0] == x_dims[0] and dims[0] != 1
    if dims[0] != 1 and not batched:
        return f"the batch of the {what} table {table.name!r} ({dims[0]}) is neither 1 nor B"
    return AngleTable(table, batched, None, None, half=True)


def _folded_table(
    value: ir.Value | None, x_dims: list, rotary_dim: int, what: str
) -> AngleTable | str | None:
    """A constant ``[1, 1, S, r]`` cosine or sine: ``Unsqueeze(c, 1)`` of a ``[1, S, r]``
    table that constant folding computed (a graph exported for one length, whose
    positions are ``0 .. S - 1``); its first half, one row per position, is the cache.
    None when ``value`` is no such constant."""
    array = constant_array(value) if value is not None else None
    if array is None or array.ndim != 4 or array.shape[:2] != (1, 1):
        return None
    if array.shape[2] != x_dims[2] or array.shape[3] != rotary_dim:
        return (
            f"the constant {what} {value.name!r} {list(array.shape)} does not cover the "  # type: ignore[union-attr]
            f"heads {x_dims} (rotary dimension {rotary_dim})"
        )
    half = rotary_dim // 2
    if not np.array_equal(array[..., :half], array[..., half:]):
        return f"the halves of the constant {what} {value.name!r} differ"  # type: ignore[union-attr]
    return AngleTable(value, False, array[0, 0, :, :half].astype(np.float32), None)  # type: ignore[arg-type]


def _gathered_table(value: ir.Value, rotary_dim: int) -> AngleTable | str | None:
    """``Gather(constant table, ids)``: the table and ids (None when not that form)."""
    producer = value.producer()
    if (
        producer is None
        or producer.op_type != "Gather"
        or attribute_value(producer, "axis", 0) != 0
    ):
        return None
    table = constant_array(producer.inputs[0])
    if table is None or table.ndim != 2 or table.shape[1] != rotary_dim:
        return None
    half = rotary_dim // 2
    if not np.array_equal(table[:, :half], table[:, half:]):
        return f"the halves of the constant table {producer.inputs[0].name!r} differ"
    ids = producer.inputs[1]
    ids_dims = known_dims(ids)
    if ids_dims is None or len(ids_dims) != 2:
        return f"the position ids {ids.name!r} of the table are not [batch, S]"
    return AngleTable(value, True, table[:, :half].astype(np.float32), ids)


_SCALAR_OPS = frozenset({"Mul", "Div", "Add", "Sub"})


def _equal_halves(value: ir.Value) -> str | None:
    """Why ``value[..., :h] == value[..., h:]`` is not shown by its computation, or None:
    elementwise steps (Cos, Sin, Cast, Neg, a scalar constant) back to ``Concat(f, f)``."""
    for _ in range(8):
        producer = value.producer()
        if producer is None:
            return f"{value.name!r} is not computed in the graph"
        op = producer.op_type
        if op == "Concat":
            inputs = producer.inputs
            if (
                len(inputs) == 2
                and inputs[0] is inputs[1]
                and attribute_value(producer, "axis", 0) in (-1, 2)
            ):
                return None
            return f"Concat {producer.name!r} does not repeat one value along the last axis"
        if op in ("Cos", "Sin", "Cast", "Identity", "Neg"):
            value = producer.inputs[0]
            continue
        if op in _SCALAR_OPS:
            constants = [constant_array(v) for v in producer.inputs]
            if constants[1] is not None and constants[1].size == 1 and constants[0] is None:
                value = producer.inputs[0]
                continue
            if op in ("Mul", "Add") and constants[0] is not None and constants[0].size == 1:
                value = producer.inputs[1]
                continue
        return f"{op} {producer.name!r} is not an elementwise step of the angle"
    return "the angle's computation is longer than the steps followed"


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
        suffix = "" if dtype == ir.DataType.FLOAT else f"_{dtype.name.lower()}"
        cache = table.table.astype(dtype.numpy())
        return ctx.initializer(f"{table.value.name}angle_cache{suffix}", cache)
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
    ``[0]`` (row ``s`` for every batch) where onnxruntime takes that form."""
    if table.ids is not None:
        if table.ids.dtype == ir.DataType.INT64:
            return table.ids
        nodes.append(ir.Node("", "Cast", [table.ids], [ir.AttrInt64("to", ir.DataType.INT64)]))
        return nodes[-1].outputs[0]
    if not table.batched and contrib:
        return ctx.initializer("rotary_offset", np.array([0], np.int64))
    if table.table is not None:  # a folded table: row s for every batch of x
        return _rows_for_every_batch(table.table.shape[0], x, ctx, nodes)
    key = f"rotary_positions:{table.value.name}" + ("" if table.batched else f":{x.name}")
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
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
