"""The attention mask: what the attention ops take (MultiHeadAttention,
GroupQueryAttention), and the NaN guard of SDPA exports. Shared by ``attention`` and
``group_query_attention``."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.rewriters._fused_sizes import FusedSizeProof
from autofusion.fusion_core.rewriters._mask_sizes import attention_bias as attention_bias
from autofusion.fusion_core.rewriters._mask_sizes import decided, shown_sizes
from autofusion.fusion_core.sizes import ONE, known_dims

_ONNX = ("", "ai.onnx")
# ops that give finite values from finite operands (short of a float overflow, which no
# position bias reaches), read through by ``_minus_inf_source``; Gather reads its data
_FINITE_OPS = frozenset(
    {
        "Identity", "Transpose", "Reshape", "Expand", "Unsqueeze", "Squeeze", "Slice",
        "Gather", "GatherElements", "Concat", "Tile", "Cast", "Where", "Add", "Sub", "Mul",
        "Neg", "Abs", "MatMul", "Gemm", "Tanh", "Sigmoid", "Relu",
    }
)  # fmt: skip
_FLOAT_TYPES = frozenset(
    {ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16, ir.DataType.DOUBLE}
)
_CONE = 64  # nodes read back from a bias before it is called unproven


def expand_queries(
    mask: ir.Value, q: ir.Value, ctx: RewriteContext
) -> tuple[ir.Value, list[ir.Node]]:
    """``mask`` [B or 1, heads or 1, 1, L] broadcast to every query of ``q`` [B, S, E]
    (MultiHeadAttention's attention_bias has a row per query): Expand by [1, 1, S, 1],
    S read from q's shape; or ``mask`` as it is when it has a row per query already
    (``attention_bias`` proved it has 1 or S rows: sizes tell which, else the labels)."""
    rank = len(mask.shape) if mask.shape is not None else None
    rows = FusedSizeProof().bound(mask, 2) if rank == 4 else None
    label = (known_dims(mask) or [None] * 3)[2] if rank == 4 else None
    if rows != ONE and (decided(rows) or label != 1):
        return mask, []
    ones = ctx.initializer("mask_rows_ones", np.array([1, 1], np.int64))
    one = ctx.initializer("mask_rows_one", np.array([1], np.int64))
    shape = ir.Node("", "Shape", [q])
    length = ir.Node("", "Gather", [shape.outputs[0], one], [ir.AttrInt64("axis", 0)])
    target = ir.Node("", "Concat", [ones, length.outputs[0], one], [ir.AttrInt64("axis", 0)])
    expand = ir.Node("", "Expand", [mask, target.outputs[0]])
    expand.outputs[0].dtype = mask.dtype
    return expand.outputs[0], [shape, length, target, expand]


def guarded_mask(
    mask: ir.Value, guard: ir.Node, ctx: RewriteContext
) -> tuple[ir.Value, ir.Value | None, list[ir.Node]] | str:
    """The mask for MultiHeadAttention and, if needed, which rows to keep, so that
    MultiHeadAttention followed by the keep multiply computes what the graph's
    Softmax -> Where(IsNaN(P), 0, P) computes.

    A mask ``Where(cond, a, b)`` of finite constants never gives a row of ``-inf``: a
    fully masked row gets a uniform softmax in both graphs and the guard never fires
    (dynamo's ``Where(mask, 0, -3.4e38)``). With ``-inf`` on one side (TorchScript's
    ``Where(mask, 0, -inf)``) a fully masked row is NaN and the guard makes the context
    0, while MultiHeadAttention would give NaN: so ``-inf`` becomes the lowest finite
    value of the mask's type (float32 or float16) and the output rows whose mask row
    attends to nothing are multiplied by 0. ``cond`` must be the same for every head
    (``[B or 1, 1, S, L]``), as the keep factor is per row of the merged output.
    """
    zero = constant_array(guard.inputs[1])
    if zero is None or zero.size != 1 or float(zero.reshape(-1)[0]) != 0.0:
        return f"Where {guard.name!r} after the Softmax does not replace NaN by 0"
    producer = mask.producer()
    if producer is not None and producer.op_type == "Add" and producer.domain in _ONNX:
        biased = _biased_guarded_mask(mask, producer, ctx)
        if biased is not None:
            return biased
    arrays = (
        [constant_array(v) for v in producer.inputs[1:]]
        if producer is not None and producer.op_type == "Where"
        else [None]
    )
    if any(a is None for a in arrays):
        return (
            f"the mask {mask.name!r} is not Where of constants: a fully masked row (-inf) "
            "gives NaN, which the graph turns into 0 and MultiHeadAttention does not"
        )
    if all(np.all(np.isfinite(a)) for a in arrays):
        return mask, None, []
    assert producer is not None
    if mask.dtype not in (ir.DataType.FLOAT, ir.DataType.FLOAT16):
        shown = mask.dtype.name if mask.dtype is not None else "unknown"
        return (
            f"the mask {mask.name!r} holds -inf in {shown}: only a float32 or float16 one "
            "is made finite"
        )
    minus_inf = [bool(np.all(np.isneginf(a))) for a in arrays]
    if sum(minus_inf) != 1 or not all(
        np.all(np.isfinite(a)) or m for a, m in zip(arrays, minus_inf, strict=True)
    ):
        return (
            f"the mask {mask.name!r} is not Where(cond, finite, -inf) or Where(cond, -inf, finite)"
        )
    cond = producer.inputs[0]
    refused = _per_row_condition(cond, mask)
    if refused is not None:
        return refused
    assert cond is not None
    finite = [np.where(np.isneginf(a), np.finfo(a.dtype).min, a).astype(a.dtype) for a in arrays]
    values = [ctx.initializer(f"{mask.name}_finite", a) for a in finite]
    where = ir.Node("", "Where", [cond, *values])
    keep, nodes = _keep_rows(cond, minus_inf[0], mask.dtype, ctx)
    return _like(where.outputs[0], mask), keep, [where, *nodes]


def _like(value: ir.Value, mask: ir.Value) -> ir.Value:
    """``value``, a Where of ``mask``'s condition and constants of its constants' shapes,
    with ``mask``'s type and shape: sizes needs every value's rank (``expand_queries``
    reads the rows)."""
    value.dtype = mask.dtype
    value.shape = ir.Shape(list(mask.shape)) if mask.shape is not None else None
    return value


def _biased_guarded_mask(
    mask: ir.Value, add: ir.Node, ctx: RewriteContext
) -> tuple[ir.Value, ir.Value, list[ir.Node]] | str | None:
    """``guarded_mask`` for ``mask = bias + Where(cond, k, -inf)`` (either order, either
    side ``-inf``, ``k`` finite): CPM-Ant's position bias beside its mask once
    ``one_bias`` has summed them. The finite mask is ``Where(cond, bias + k, lowest)``
    (``bias`` alone where ``k`` is 0: the graph's own sum on the rows it keeps, and no
    float16 overflow of ``bias + lowest`` on the others), and the rows ``cond`` masks
    fully are zeroed after the op as for ``Where(cond, k, -inf)`` alone. With both sides
    finite no row is NaN and the guard never fires: the mask is taken as it is. Either
    holds only if the bias is never ``-inf``: a row the bias alone masks fully is NaN in
    the graph, then 0, while the op gives it the average of the keys ``cond`` masks. So
    the bias must be proven free of ``-inf`` (``_minus_inf_source``). None where ``mask``
    is not this form."""
    for index, operand in enumerate(add.inputs):
        where = operand.producer() if operand is not None else None
        if where is None or where.op_type != "Where" or where.domain not in _ONNX:
            continue
        arrays = [constant_array(v) for v in where.inputs[1:]]
        if any(a is None for a in arrays):
            continue
        minus_inf = [bool(np.all(np.isneginf(a))) for a in arrays]  # type: ignore[arg-type]
        finite = [bool(np.all(np.isfinite(a))) for a in arrays]  # type: ignore[arg-type]
        one_side = sorted(minus_inf) == [False, True] and finite == [not m for m in minus_inf]
        if not all(finite) and not one_side:
            continue
        bias, cond = add.inputs[1 - index], where.inputs[0]
        why = _minus_inf_source(bias)
        if why is not None:
            return (
                f"the bias {bias.name!r} beside the mask {operand.name!r} is not proven free "  # type: ignore[union-attr]
                f"of -inf ({why}): a row it masks fully is NaN, then 0 in the graph, and "
                "MultiHeadAttention does not give 0 there"
            )
        if all(finite):  # a finite bias plus finite constants: no row is NaN, no guard fires
            return mask, None, []
        refused = _per_row_condition(cond, mask)
        if refused is not None:
            return refused
        assert bias is not None and cond is not None
        return _bias_where_finite(mask, (bias, cond), arrays, minus_inf[0], ctx)
    return None


def _bias_where_finite(
    mask: ir.Value,
    bias_and_cond: tuple[ir.Value, ir.Value],
    arrays: list,
    true_is_minus_inf: bool,
    ctx: RewriteContext,
) -> tuple[ir.Value, ir.Value, list[ir.Node]]:
    """``Where(cond, bias + k, lowest)`` (the sides in the mask's order) and the rows to
    keep."""
    bias, cond = bias_and_cond
    k = arrays[1] if true_is_minus_inf else arrays[0]
    nodes: list[ir.Node] = []
    kept = bias
    if np.any(k != 0):
        nodes.append(ir.Node("", "Add", [bias, ctx.initializer(f"{mask.name}_kept", k)]))
        kept = nodes[-1].outputs[0]
    dtype = np.dtype(k.dtype)
    lowest = ctx.initializer(f"{mask.name}_lowest", np.array(np.finfo(dtype).min, dtype))
    sides = [lowest, kept] if true_is_minus_inf else [kept, lowest]
    nodes.append(ir.Node("", "Where", [cond, *sides]))
    finite = nodes[-1].outputs[0]
    finite.dtype, finite.shape = mask.dtype, mask.shape
    keep, keep_nodes = _keep_rows(cond, true_is_minus_inf, mask.dtype, ctx)
    return finite, keep, [*nodes, *keep_nodes]


def _minus_inf_source(bias: ir.Value | None) -> str | None:
    """Where ``bias`` may take ``-inf`` from, or None when it cannot: its float values
    come, through ops that keep finite values finite, from constants that are finite
    (CPM-Ant's bias is a Gather from its table of bucket weights, transposed). Integer
    and boolean inputs (a Gather's indices, a Where's condition) are not followed."""
    pending, seen = [bias], 0
    while pending:
        value = pending.pop()
        if value is None or value.dtype not in _FLOAT_TYPES:
            continue
        seen += 1
        if seen > _CONE:
            return f"more than {_CONE} values to read back"
        array = constant_array(value)
        if array is not None:
            if not np.all(np.isfinite(array)):
                return f"the constant {value.name!r} is not finite"
            continue
        producer = value.producer()
        if producer is None:
            return f"the graph input {value.name!r}"
        if producer.op_type not in _FINITE_OPS or producer.domain not in _ONNX:
            return f"{producer.op_type} {producer.name!r}"
        inputs = producer.inputs[:1] if producer.op_type.startswith("Gather") else producer.inputs
        pending += list(inputs)
    return None


def _per_row_condition(cond: ir.Value | None, mask: ir.Value) -> str | None:
    """Why the rows ``cond`` masks fully cannot be zeroed after the heads are merged
    (its heads axis is not 1, ``[B or 1, 1, S, L]``: proven by ``fusion_core.sizes``, or
    labelled 1 where sizes cannot tell), or None."""
    rank = len(cond.shape) if cond is not None and cond.shape is not None else None
    heads = FusedSizeProof().bound(cond, 1) if rank == 4 else None
    labels = known_dims(cond) if rank == 4 else None
    if heads == ONE or (not decided(heads) and labels is not None and labels[1] == 1):
        return None
    return (
        f"the condition of mask {mask.name!r} is not known to be [B or 1, 1, S, L] (its "
        f"heads proven {shown_sizes([heads])[0]}, labels {labels}): rows fully masked for "
        "some heads only cannot be kept apart after the merge"
    )


def _keep_rows(
    cond: ir.Value, true_is_minus_inf: bool, dtype: ir.DataType | None, ctx: RewriteContext
) -> tuple[ir.Value, list[ir.Node]]:
    """``[B, S, 1]`` in ``dtype`` (the mask's): 1 where the row of ``cond`` attends to
    something, 0 where the whole row was masked; and the nodes computing it."""
    nodes: list[ir.Node] = []
    attend = cond
    if true_is_minus_inf:  # True selects -inf: the positions attended to are the False ones
        nodes.append(ir.Node("", "Not", [cond]))
        attend = nodes[-1].outputs[0]
    nodes.append(ir.Node("", "Cast", [attend], [ir.AttrInt64("to", ir.DataType.FLOAT)]))
    if ctx.opset >= 18:
        axes = ctx.initializer("keep_rows_axes", np.array([3], dtype=np.int64))
        reduce = ir.Node(
            "", "ReduceMax", [nodes[-1].outputs[0], axes], [ir.AttrInt64("keepdims", 0)]
        )
    else:
        reduce = ir.Node(
            "",
            "ReduceMax",
            [nodes[-1].outputs[0]],
            [ir.AttrInt64s("axes", [3]), ir.AttrInt64("keepdims", 0)],
        )
    nodes.append(reduce)  # [B, 1, S]: 1 where the row attends to something
    nodes.append(ir.Node("", "Transpose", [reduce.outputs[0]], [ir.AttrInt64s("perm", [0, 2, 1])]))
    if dtype != ir.DataType.FLOAT:  # multiplies the attention's output, of its type
        nodes.append(ir.Node("", "Cast", [nodes[-1].outputs[0]], [ir.AttrInt64("to", dtype)]))
    if cond.shape is not None and len(cond.shape) == 4:
        _shape_keep_rows(nodes, reduce, tuple(cond.shape))
    return nodes[-1].outputs[0], nodes


def _shape_keep_rows(nodes: list[ir.Node], reduce: ir.Node, dims: tuple) -> None:
    """The shapes of ``_keep_rows``'s values from its condition's ``dims``: [B, 1, S, L]
    before the ReduceMax, [B, 1, S] out of it, [B, S, 1] after. ``fusion_core.sizes``
    needs every value's rank: so it proves the sizes of what the keep factor multiplies
    (the next layer's scores among them)."""
    b, h, s, _ = dims
    shapes = iter([list(dims)] * nodes.index(reduce) + [[b, h, s]] + [[b, s, h]] * len(nodes))
    for node, shape in zip(nodes, shapes, strict=False):
        node.outputs[0].shape = ir.Shape(shape)


def empty_rows_as_mean(
    mask: ir.Value,
    mean: ir.Value,
    context: ir.Value,
    heads_and_size: tuple[int, int],
    ctx: RewriteContext,
) -> list[ir.Node]:
    """ONNX Attention as onnxruntime 1.32 runs it gives 0 where a query's mask row is
    the lowest float everywhere (it reads the lowest as "masked"); the graph's softmax
    of those equal scores is uniform there, the mean of the values, as
    com.microsoft.MultiHeadAttention gives (both measured with one-node models). So
    those rows of ``context`` (``[B, S, N * Hv]``) take ``mean`` (``[B, 1, N * Hv]``,
    each query head's mean value over its keys), head by head (the mask's head axis is
    1 or N): ``Where(ReduceMax(mask, keys) <= lowest, mean, context)``, a no-op on a
    runtime that already gives the mean. Nothing is added for a float16 mask (below)."""
    if context.dtype != ir.DataType.FLOAT:  # the scores' type, the mask's
        # float16: onnxruntime runs the graph's float16 softmax in float32, where a row
        # masked by -65504 is the softmax of its scores over every key: neither 0 nor the
        # mean, and rows only padded queries have are left as the kernel gives them
        return []
    heads, size = heads_and_size
    lowest = np.array(np.finfo(np.float32).min, np.float32)
    keys = ctx.initializer("empty_rows_keys", np.array([3], np.int64))
    row_max = ir.Node("", "ReduceMax", [mask, keys], [ir.AttrInt64("keepdims", 1)])
    empty = ir.Node("", "LessOrEqual", [row_max.outputs[0], ctx.initializer("lowest", lowest)])
    rows = ir.Node("", "Transpose", [empty.outputs[0]], [ir.AttrInt64s("perm", [0, 2, 1, 3])])
    by_head = ctx.initializer("empty_rows_by_head", np.array([0, 0, heads, size], np.int64))
    split = ir.Node("", "Reshape", [context, by_head])  # [B, S, N, Hv]
    mean_split = ir.Node("", "Reshape", [mean, by_head])  # [B, 1, N, Hv]
    picked = ir.Node("", "Where", [rows.outputs[0], mean_split.outputs[0], split.outputs[0]])
    merged = ctx.initializer("empty_rows_merged", np.array([0, 0, heads * size], np.int64))
    out = ir.Node("", "Reshape", [picked.outputs[0], merged])
    return [row_max, empty, rows, split, mean_split, picked, out]
