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
``(x_2i, x_2i+1)``; RoFormer's, its angles stacked copies of two parts of one table
gathered by position, ``_rotary_gathered``) is proven in ``_rotary_pairs`` and becomes
the same op with ``interleaved = 1``, on the ``[B, S, N * H]`` projection its
``[B, S, N, H]`` heads come from; on heads laid out ``[B, N, S, H]`` that are no head split of
their own it rotates the 4-D ``x`` itself. DeepSeek-V4 rotates the *trailing* ``r``
channels of each head, ``Concat(x[..., :-r], rot(x[..., -r:]))``: the pattern's
whole-head form matches the rope part ``x[..., -r:]`` (a Slice or Split of the
transposed heads, 4-D), the op rotates that part alone and the Concat stays;
``concat_heads`` then lays the parts out as a head split the attention reads. Slice
bounds are read as ONNX reads them (a negative bound counts from the end), never
assumed.

Reading the cos and sin (computed, gathered from a table, folded into the batch, a
constant ``[1, 1, S, r / 2]`` table of a graph exported at one length, or Pixtral's
``Unsqueeze(c, 0)`` of a ``[S, r]`` table with no batch axis, read at ``0 .. S - 1``)
and making the op's caches and position ids from them are ``_rotary_tables`` and
``_rotary_inputs``; two constant caches must be the cosine and sine of one angle per
entry (``cos^2 + sin^2`` one number).

The sizes the rewrite rests on (the heads' count and size, the tables' rows against the
heads' positions, their batch against the heads' or 1, the Reshapes around the pairs) are
proven by ``FusedSizeProof`` (``_rotary_tables.Heads``), not read from the labels an
inference wrote, which may give a table of other positions the heads' sequence symbol:
proven different refuses, and the labels decide only where the proof cannot tell.

On the generic target, ONNX ``RotaryEmbedding`` (opset 23,
https://onnx.ai/onnx/operators/onnx__RotaryEmbedding.html) computes the same from the
same cache and 2-D position ids; below opset 23 the block is left as it is.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._attention_shapes import heads_of
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
)
from autofusion.fusion_core.rewriters._fused_sizes import FusedSizeProof
from autofusion.fusion_core.rewriters._rotary_inputs import angle_cache, rotary_positions
from autofusion.fusion_core.rewriters._rotary_pairs import (
    heads_first,
    interleaved_layout,
    interleaved_table,
    pairs_source,
)
from autofusion.fusion_core.rewriters._rotary_tables import (
    AngleTable,
    Heads,
    angle_table,
    one_rotation,
)
from autofusion.fusion_core.sizes import SizeProof, scalar
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["ROTARY_OPSET", "RotaryEmbedding"]

ROTARY_OPSET = 23  # ONNX RotaryEmbedding


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
        # the sizes the heads and the tables are checked on, proven (labels where it
        # cannot tell): one proof per rewrite
        proof = FusedSizeProof()
        layout = (interleaved_layout if params.interleaved else _layout)(match, params, proof)
        if isinstance(layout, str):
            return layout
        x, rotary_dim = layout
        x_heads = Heads.of(x, proof)
        assert x_heads is not None
        dims = x_heads.dims
        if params.interleaved:
            return _interleaved(match, params, (x_heads, rotary_dim), ctx, contrib)
        cos = angle_table(match.value("$cos"), x_heads, rotary_dim, "cos")
        sin = angle_table(match.value("$sin"), x_heads, rotary_dim, "sin")
        for table in (cos, sin):
            if isinstance(table, str):
                return table
        assert not isinstance(cos, str) and not isinstance(sin, str)
        if cos.batched != sin.batched or cos.ids is not sin.ids:
            return "cos and sin are not indexed the same way (batch or position ids differ)"
        unpaired = one_rotation(cos, sin)
        if unpaired is not None:
            return unpaired
        nodes: list[ir.Node] = []
        cos_cache = angle_cache(cos, rotary_dim, ctx, nodes, x.dtype)
        sin_cache = angle_cache(sin, rotary_dim, ctx, nodes, x.dtype)
        positions = rotary_positions(cos, x, contrib, ctx, nodes)
        heads, size = int(dims[1]), int(dims[3])  # type: ignore[arg-type]
        split = _head_split(x, (heads, size), proof)
        rotated_in = split[0].inputs[0] if split is not None else x
        attrs = [ir.AttrInt64("num_heads", heads), ir.AttrInt64("rotary_embedding_dim", rotary_dim)]
        rotary = _rotary_op(rotated_in, positions, (cos_cache, sin_cache), attrs, ctx, contrib)
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
    layout: tuple[Heads, int],
    ctx: RewriteContext,
    contrib: bool,
) -> Rewrite | str:
    """GPT-J's spelling (``_rotary_pairs``): the [B, S, N * H] projection rotated by an
    interleaved RotaryEmbedding, and the heads split again after it; ``layout`` is the
    heads x (with their proven dims and the proof) and the rotary dimension, checked.
    Heads laid out [B, N, S, H] that are no head split of their own (DeepSeek-V4's rope
    part, a Slice of the last axis of the heads) are rotated as they are, the op's 4-D
    form."""
    x_heads, rotary_dim = layout
    x, dims = x_heads.value, x_heads.dims
    first = heads_first(x, match.value("$cos"))
    tables = _interleaved_tables(match, x_heads, rotary_dim, first)
    if isinstance(tables, str):
        return tables
    cos, sin = tables
    heads, size = int(dims[1 if first else 2]), int(dims[3])  # type: ignore[arg-type]
    head_split = _head_split(x, (heads, size), x_heads.proof) if first else None
    split = head_split[0] if head_split is not None else None
    if not first:
        split = pairs_source(x_heads, (heads, size))
        if split is None:
            return f"the heads {x.name!r} are not a Reshape of a [B, S, {heads * size}] projection"
    rotated_in = split.inputs[0] if split is not None else x
    nodes: list[ir.Node] = []
    cos_cache = angle_cache(cos, rotary_dim, ctx, nodes, rotated_in.dtype)
    sin_cache = angle_cache(sin, rotary_dim, ctx, nodes, rotated_in.dtype)
    positions = rotary_positions(cos, rotated_in, contrib, ctx, nodes)
    attrs = [
        ir.AttrInt64("num_heads", heads),
        ir.AttrInt64("rotary_embedding_dim", rotary_dim),
        ir.AttrInt64("interleaved", 1),
    ]
    nodes.append(_rotary_op(rotated_in, positions, (cos_cache, sin_cache), attrs, ctx, contrib))
    _copy_type(rotated_in, nodes[-1].outputs[0])
    if split is not None:  # the heads split again, as x was
        nodes.append(ir.Node("", "Reshape", [nodes[-1].outputs[0], split.inputs[1]], _attrs(split)))
        _copy_type(split.outputs[0], nodes[-1].outputs[0])
    if head_split is not None:  # and transposed again
        nodes.append(ir.Node("", "Transpose", [nodes[-1].outputs[0]], _attrs(head_split[1])))
    out = match.node(params.concat_node or params.sum_node).outputs[0]
    _copy_type(out, nodes[-1].outputs[0])
    return Rewrite(nodes, [(out, nodes[-1].outputs[0])])


def _interleaved_tables(
    match: Match, x_heads: Heads, rotary_dim: int, first: bool
) -> tuple[AngleTable, AngleTable] | str:
    """The cos and sin behind the interleaved rotation's repeat_interleave, indexed the
    same way, or why not."""
    tables = []
    for free, what in (("$cos", "cos"), ("$sin", "sin")):
        found = interleaved_table(match.value(free), x_heads, rotary_dim, what, transposed=first)
        if isinstance(found, str):
            return found
        value, batched, constant, ids, holds = found
        tables.append(
            AngleTable(value, batched, constant, ids, half=holds == "half", pairs=holds == "pairs")
        )
    cos, sin = tables
    if cos.batched != sin.batched or cos.ids is not sin.ids:
        return "cos and sin are not indexed the same way (batch or position ids differ)"
    return one_rotation(cos, sin) or (cos, sin)


def _rotary_op(
    rotated_in: ir.Value,
    positions: ir.Value,
    caches: tuple[ir.Value, ir.Value],
    attrs: list[ir.Attr],
    ctx: RewriteContext,
    contrib: bool,
) -> ir.Node:
    """com.microsoft RotaryEmbedding (input, position_ids, cos, sin), or ONNX's (input,
    cos, sin, position_ids) on the generic target."""
    if contrib:
        ctx.use_domain(MS_DOMAIN)
        return ir.Node(MS_DOMAIN, "RotaryEmbedding", [rotated_in, positions, *caches], attrs)
    return ir.Node("", "RotaryEmbedding", [rotated_in, *caches, positions], attrs)


def _layout(match: Match, params: RotaryParams, proof: SizeProof) -> tuple[ir.Value, int] | str:
    """(the 4-D heads x, the rotary dimension r), after checking every slice; x's heads
    and head size as ``proof`` gives them (the labels where it cannot tell)."""
    lo, hi = match.node(params.low_node), match.node(params.high_node)
    x = match.value("$x")
    if params.rotary_node is not None:
        part = match.node(params.rotary_node)
        x = part.inputs[0]
    x_heads = Heads.of(x, proof) if x is not None else None
    dims = x_heads.dims if x_heads is not None else None
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
    """[start, end) of a Slice of the last axis (step 1) as ONNX reads it: a negative
    bound counts from the end, both clamped to ``[0, size]``."""
    start, end = scalar(node.inputs[1]), scalar(node.inputs[2])
    axes = scalar(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    step = scalar(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else 1
    if start is None or end is None or axes not in (-1, 3) or step != 1:
        return f"Slice {node.name!r} is not a slice of the last axis with bounds the graph fixes"
    start, end = (min(max(v + size if v < 0 else v, 0), size) for v in (start, end))
    return start, end


def _head_split(
    x: ir.Value, heads: tuple[int, int], proof: SizeProof
) -> tuple[ir.Node, ir.Node] | None:
    """(Reshape, Transpose) when ``x`` is the head split of a [B, S, N * H] tensor (its
    batch and sequence kept, proven by ``proof``)."""
    transpose = x.producer()
    if transpose is None or transpose.op_type != "Transpose":
        return None
    if list(attribute_value(transpose, "perm", []) or []) != [0, 2, 1, 3]:
        return None
    reshape = transpose.inputs[0].producer() if transpose.inputs[0] is not None else None
    if reshape is None or reshape.op_type != "Reshape":
        return None
    if heads_of([reshape], proof) != heads:
        return None
    return reshape, transpose


def _attrs(node: ir.Node) -> list[ir.Attr]:
    return [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()]


def _copy_type(source: ir.Value, target: ir.Value) -> None:
    target.type, target.shape = source.type, source.shape
