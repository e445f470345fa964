"""``rotary``: a rotary position embedding (RoPE) written out becomes one op.

The exporters write Hugging Face's ``apply_rotary_pos_emb`` with ``rotate_half`` on the
query or key heads ``x`` of shape ``[B, N, S, H]``, with ``h = r / 2``::

    rotate_half(x) = Concat(Neg(x[..., h:r]), x[..., :h], axis=-1)
    y = x * cos + rotate_half(x) * sin                       (r = H)
    y = Concat(x_r * cos + rotate_half(x_r) * sin, x[..., r:], axis=-1),
        x_r = x[..., :r]                                     (partial rotary, r <= H:
                                                             Phi-3 slices even when r = H)

where ``cos`` and ``sin`` are ``Unsqueeze(c, 1)`` of ``c[Bc, S, r]`` (``Bc`` is 1 or B)
whose two halves are equal: ``c[..., i] == c[..., i + h]``. That is what makes it a
rotation of the pairs ``(x_i, x_{i+h})`` by the angle whose cosine is ``c[..., i]``, which
is what onnxruntime's com.microsoft ``RotaryEmbedding`` computes from a cache
``cos_cache[position_ids[b, s], i]`` (non-interleaved, ``rotary_embedding_dim = r``, the
features past ``r`` passed through;
https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.RotaryEmbedding).

The cache is the graph's own ``c``, so any position ids and any frequency scaling are
honoured exactly: ``cos_cache = Reshape(c[..., :h], [-1, h])`` (``Bc * S`` rows) with
``position_ids[b, s] = b * S + s`` when ``Bc = B`` (computed from the position ids, as
optimum's decoder export does), or the one-element ``position_ids = [0]`` (row ``s``
for every batch) when ``Bc = 1`` (positions that do not depend on the batch, as the
dynamo exporter writes a prefill). Where ``c`` is ``Gather(table, ids)`` of a constant
table, the table's first half is the cache and ``ids`` the position ids.

The equal halves are proven, never assumed: ``c`` must be ``Cos`` or ``Sin`` of
``Concat(f, f, axis=-1)`` (the same value twice), possibly through Casts and products
with a scalar constant (the attention scaling), or a constant table whose halves are
equal; or the angles are ``Concat(u, u, axis=-1)`` of ``u = Unsqueeze(t, 1)``, ``t`` a
``[Bc, S, r / 2]`` table of one angle per pair (gpt-oss's rotation of two halves, which
the canonical ``rotary_halves`` writes so), whose cache is ``t`` itself. Cache and
position ids are built once per ``c`` and shared by every layer.

When ``x`` is the head split ``Transpose(Reshape(q, [B, S, N, H]), [0, 2, 1, 3])`` of a
``[B, S, N * H]`` projection, the rotation is applied to ``q`` (the op's 3-D form, with
``num_heads = N``) and the head split re-created after it: that is the layout
``GroupQueryAttention`` reads (``group_query_attention``). Otherwise the op rotates the
4-D ``x`` itself.

GPT-J's interleaved spelling (``rotate_every_two``: the features rotated in pairs
``(x_2i, x_2i+1)``) is proven in ``_rotary_pairs`` and becomes the same op with
``interleaved = 1``, on the ``[B, S, N * H]`` projection its ``[B, S, N, H]`` heads come
from.

On the generic target, ONNX ``RotaryEmbedding`` (opset 23,
https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html) computes the same from the
same cache and 2-D position ids; below opset 23 the block is left as it is.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical import axes_of, known_dims, scalar
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._attention_shapes import heads_of
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
)
from autofusion.fusion_core.rewriters._rotary_pairs import (
    interleaved_layout,
    interleaved_table,
    pairs_source,
    transposed_heads,
)
from autofusion.fusion_core.rewriters._shared import mark_shared, shared_value
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["ROTARY_OPSET", "RotaryEmbedding"]

ROTARY_OPSET = 23  # ONNX RotaryEmbedding
_BIG = 2**31 - 1  # a Slice end at least this large means "to the end"


class RotaryParams(Params):
    low_node: str = "lo"  # Slice x[..., :h]
    high_node: str = "hi"  # Slice x[..., h:r]
    rotate_node: str = "rot"  # Concat(Neg(hi), lo)
    cos_node: str = "cos_mul"  # Mul(x, cos)
    sin_node: str = "sin_mul"  # Mul(rot, sin)
    sum_node: str = "out"  # Add(cos_mul, sin_mul)
    rotary_node: str | None = None  # partial rotary: Slice x[..., :r]
    pass_node: str | None = None  # partial rotary: Slice x[..., r:]
    concat_node: str | None = None  # partial rotary: Concat(sum, pass)
    # GPT-J's rotate_every_two (_rotary_pairs): low/high are the even and odd Slices,
    # rotate the Concat of their Unsqueezes, flatten the Reshape of the pairs
    interleaved: bool = False
    flatten_node: str | None = None


class RotaryEmbedding(Rewriter):
    name = "rotary"
    targets = frozenset({"onnxruntime", "generic"})
    Params = RotaryParams

    def rewrite(self, match: Match, params: RotaryParams, ctx: RewriteContext) -> Rewrite | str:
        contrib = ctx.target.can_emit(MS_DOMAIN)
        if not contrib and ctx.opset < ROTARY_OPSET:
            return opset_refusal("ONNX RotaryEmbedding", ROTARY_OPSET, ctx)
        layout = (interleaved_layout if params.interleaved else _layout)(match, params)
        if isinstance(layout, str):
            return layout
        x, rotary_dim = layout
        dims = known_dims(x)
        assert dims is not None
        if params.interleaved:
            return _interleaved(match, params, (x, rotary_dim, dims), ctx, contrib)
        cos = _angle_table(match.value("$cos"), dims, rotary_dim, "cos")
        sin = _angle_table(match.value("$sin"), dims, rotary_dim, "sin")
        for table in (cos, sin):
            if isinstance(table, str):
                return table
        assert not isinstance(cos, str) and not isinstance(sin, str)
        if cos.batched != sin.batched or cos.ids is not sin.ids:
            return "cos and sin are not indexed the same way (batch or position ids differ)"
        nodes: list[ir.Node] = []
        cos_cache = _cache(cos, rotary_dim, ctx, nodes, x.dtype)
        sin_cache = _cache(sin, rotary_dim, ctx, nodes, x.dtype)
        positions = _positions(cos, x, contrib, ctx, nodes)
        heads, size = int(dims[1]), int(dims[3])  # type: ignore[arg-type]
        split = _head_split(x, (heads, size))
        rotated_in = split[0].inputs[0] if split is not None else x
        attrs = [ir.AttrInt64("num_heads", heads), ir.AttrInt64("rotary_embedding_dim", rotary_dim)]
        if contrib:
            ctx.use_domain(MS_DOMAIN)
            rotary = ir.Node(
                MS_DOMAIN, "RotaryEmbedding", [rotated_in, positions, cos_cache, sin_cache], attrs
            )
        else:
            rotary = ir.Node(
                "", "RotaryEmbedding", [rotated_in, cos_cache, sin_cache, positions], attrs
            )
        nodes.append(rotary)
        _copy_type(rotated_in, rotary.outputs[0])
        if split is not None:  # the head split again, after the rotation
            reshape, transpose = split
            nodes.append(
                ir.Node("", "Reshape", [rotary.outputs[0], reshape.inputs[1]], _attrs(reshape))
            )
            _copy_type(reshape.outputs[0], nodes[-1].outputs[0])
            nodes.append(ir.Node("", "Transpose", [nodes[-1].outputs[0]], _attrs(transpose)))
        out = match.node(params.concat_node or params.sum_node).outputs[0]
        _copy_type(out, nodes[-1].outputs[0])
        return Rewrite(nodes, [(out, nodes[-1].outputs[0])])


def _interleaved(
    match: Match,
    params: RotaryParams,
    layout: tuple[ir.Value, int, list],
    ctx: RewriteContext,
    contrib: bool,
) -> Rewrite | str:
    """GPT-J's spelling (``_rotary_pairs``): the [B, S, N * H] projection rotated by an
    interleaved RotaryEmbedding, and the heads split again after it; ``layout`` is the
    heads x [B, S, N, H], the rotary dimension and x's dims, checked."""
    x, rotary_dim, dims = layout
    transposed = transposed_heads(x)
    tables = []
    for free, what in (("$cos", "cos"), ("$sin", "sin")):
        found = interleaved_table(match.value(free), dims, rotary_dim, what, transposed=transposed)
        if isinstance(found, str):
            return found
        value, batched, constant, ids, holds = found
        tables.append(
            _Table(value, batched, constant, ids, half=holds == "half", pairs=holds == "pairs")
        )
    cos, sin = tables
    if cos.batched != sin.batched or cos.ids is not sin.ids:
        return "cos and sin are not indexed the same way (batch or position ids differ)"
    heads, size = int(dims[1 if transposed else 2]), int(dims[3])  # type: ignore[arg-type]
    head_split = _head_split(x, (heads, size)) if transposed else None
    split = head_split[0] if head_split is not None else pairs_source(x, (heads, size))
    if split is None or (transposed and head_split is None):
        return f"the heads {x.name!r} are not a Reshape of a [B, S, {heads * size}] projection"
    nodes: list[ir.Node] = []
    projection = split.inputs[0]
    cos_cache = _cache(cos, rotary_dim, ctx, nodes, projection.dtype)
    sin_cache = _cache(sin, rotary_dim, ctx, nodes, projection.dtype)
    positions = _positions(cos, projection, contrib, ctx, nodes)
    attrs = [
        ir.AttrInt64("num_heads", heads),
        ir.AttrInt64("rotary_embedding_dim", rotary_dim),
        ir.AttrInt64("interleaved", 1),
    ]
    if contrib:
        ctx.use_domain(MS_DOMAIN)
        inputs = [projection, positions, cos_cache, sin_cache]
        rotary = ir.Node(MS_DOMAIN, "RotaryEmbedding", inputs, attrs)
    else:
        rotary = ir.Node(
            "", "RotaryEmbedding", [projection, cos_cache, sin_cache, positions], attrs
        )
    _copy_type(projection, rotary.outputs[0])
    heads_again = ir.Node("", "Reshape", [rotary.outputs[0], split.inputs[1]], _attrs(split))
    _copy_type(split.outputs[0], heads_again.outputs[0])
    nodes += [rotary, heads_again]
    if head_split is not None:  # and the heads transposed again, as x was
        nodes.append(ir.Node("", "Transpose", [heads_again.outputs[0]], _attrs(head_split[1])))
    out = match.node(params.concat_node or params.sum_node).outputs[0]
    _copy_type(out, nodes[-1].outputs[0])
    return Rewrite(nodes, [(out, nodes[-1].outputs[0])])


class _Table:
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


def _layout(match: Match, params: RotaryParams) -> tuple[ir.Value, int] | str:
    """(the 4-D heads x, the rotary dimension r), after checking every slice."""
    lo, hi = match.node(params.low_node), match.node(params.high_node)
    x = match.value("$x")
    if params.rotary_node is not None:
        part = match.node(params.rotary_node)
        x = part.inputs[0]
    dims = known_dims(x)
    if dims is None or len(dims) != 4 or not all(isinstance(d, int) for d in (dims[1], dims[3])):
        name = x.name if x is not None else None
        return f"the rotated heads {name!r} are not known to be [B, heads, S, head_size]"
    size = int(dims[3])  # type: ignore[arg-type]
    rotary_dim = size
    if params.rotary_node is not None:
        assert params.pass_node is not None
        bounds = _slice_bounds(match.node(params.rotary_node), size)
        rest = _slice_bounds(match.node(params.pass_node), size)
        if isinstance(bounds, str) or isinstance(rest, str):
            return bounds if isinstance(bounds, str) else str(rest)
        if bounds[0] != 0 or not 0 < bounds[1] <= size or rest != (bounds[1], size):
            return (
                f"the slices {bounds} and {rest} do not split the head {size} into "
                "rotated and passed parts"
            )
        rotary_dim = bounds[1]
        concat = match.node(params.concat_node or "")
        if len(concat.inputs) != 2 or attribute_value(concat, "axis", 0) not in (-1, 3):
            return f"Concat {concat.name!r} does not join the rotated and passed parts last"
    if rotary_dim % 2:
        return f"the rotary dimension {rotary_dim} is odd"
    half = rotary_dim // 2
    low, high = _slice_bounds(lo, rotary_dim), _slice_bounds(hi, rotary_dim)
    if low != (0, half) or high != (half, rotary_dim):
        return (
            f"the halves {low} and {high} of rotate_half are not [0, {half}) and "
            f"[{half}, {rotary_dim})"
        )
    rotate = match.node(params.rotate_node)
    if len(rotate.inputs) != 2 or attribute_value(rotate, "axis", 0) not in (-1, 3):
        return f"Concat {rotate.name!r} of rotate_half does not join two halves on the last axis"
    return x, rotary_dim


def _slice_bounds(node: ir.Node, size: int) -> tuple[int, int] | str:
    """[start, end) of a Slice of the last axis (step 1), ends clamped to ``size``."""
    start, end = scalar(node.inputs[1]), scalar(node.inputs[2])
    axes = scalar(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    step = scalar(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else 1
    if start is None or end is None or axes not in (-1, 3) or step != 1:
        return f"Slice {node.name!r} is not a slice of the last axis with bounds the graph fixes"
    return max(start, 0), min(end if end < _BIG else size, size)


def _angle_table(value: ir.Value | None, x_dims: list, rotary_dim: int, what: str) -> _Table | str:
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
    return _Table(table, batched, None, None)


def _repeated_halves(
    producer: ir.Node | None, x_dims: list, rotary_dim: int, what: str
) -> _Table | str | None:
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
    return _Table(table, batched, None, None, half=True)


def _folded_table(
    value: ir.Value | None, x_dims: list, rotary_dim: int, what: str
) -> _Table | str | None:
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
    return _Table(value, False, array[0, 0, :, :half].astype(np.float32), None)  # type: ignore[arg-type]


def _gathered_table(value: ir.Value, rotary_dim: int) -> _Table | str | None:
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
    return _Table(value, True, table[:, :half].astype(np.float32), ids)


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


def _cache(
    table: _Table,
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
        return ctx.initializer(f"{table.value.name}_cache{suffix}", cache)
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


def _positions(
    table: _Table, x: ir.Value, contrib: bool, ctx: RewriteContext, nodes: list[ir.Node]
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


def _head_split(x: ir.Value, heads: tuple[int, int]) -> tuple[ir.Node, ir.Node] | None:
    """(Reshape, Transpose) when ``x`` is the head split of a [B, S, N * H] tensor."""
    transpose = x.producer()
    if transpose is None or transpose.op_type != "Transpose":
        return None
    if list(attribute_value(transpose, "perm", []) or []) != [0, 2, 1, 3]:
        return None
    reshape = transpose.inputs[0].producer() if transpose.inputs[0] is not None else None
    if reshape is None or reshape.op_type != "Reshape":
        return None
    if heads_of([reshape]) != heads:
        return None
    return reshape, transpose


def _attrs(node: ir.Node) -> list[ir.Attr]:
    return [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]


def _copy_type(source: ir.Value, target: ir.Value) -> None:
    target.type, target.shape = source.type, source.shape
