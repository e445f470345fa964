"""``group_query_attention``: the rewriter (the math, and what it proves, is in the
package's docstring). Each rewrite proves the sizes it relies on (the query's and the
key's lengths, the past length, repeat_kv's shapes) with one ``FusedSizeProof``
(``rewriters/_fused_sizes.py``, ``_proven``), and marks its last node with the sizes of
the value it replaces (``record_sizes``) for the next layer's proof."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._attention_mask import (
    attention_bias,
    empty_rows_as_mean,
    guarded_mask,
)
from autofusion.fusion_core.rewriters._attention_shapes import HeadNodes, merged_layout
from autofusion.fusion_core.rewriters._base import (
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
    scale_factor,
)
from autofusion.fusion_core.rewriters._empty_rows_guard import (
    every_row_attends,
    every_row_kept,
    unless_every_row_attends,
)
from autofusion.fusion_core.rewriters._fused_sizes import FusedSizeProof, record_sizes
from autofusion.fusion_core.rewriters.group_query_attention._bias import (
    MaskBias,
    any_key_rows,
    shared_bias,
)
from autofusion.fusion_core.rewriters.group_query_attention._causal import (
    allowed_of,
    causal_failure,
)
from autofusion.fusion_core.rewriters.group_query_attention._inputs import (
    KVSide,
    kv_side,
    repeats_heads,
    split_source,
)
from autofusion.fusion_core.rewriters.group_query_attention._lengths import lengths_of
from autofusion.fusion_core.rewriters.group_query_attention._narrow_values import (
    narrowed_context,
    padded_values,
)
from autofusion.fusion_core.rewriters.group_query_attention._proven import (
    Past,
    past_of,
    said,
    same_size,
)
from autofusion.fusion_core.rewriters.group_query_attention._sink import head_sink
from autofusion.fusion_core.rewriters.group_query_attention._summed import SummedMask, summed_mask
from autofusion.fusion_core.sizes import SizeProof
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["GroupQueryAttention"]

ATTENTION_OPSET = 23  # https://onnx.ai/onnx/operators/onnx__Attention.html
_BIAS_INPUT = 10  # attention_bias
_QUERY_SEQLENS_INPUT = 16  # query_seqlens


_KERNEL_SIZE_STEP = 8  # onnxruntime: "head_size must be a multiple of 8"


class GQAParams(HeadNodes):
    k_flat_node: str | None = None  # dynamo: K^T as Reshape, Transpose, Reshape
    k_unflat_node: str | None = None
    qk_node: str = "qk"  # MatMul(Q, K^T)
    scale_node: str | None = None  # Mul or Div of the scores
    q_scale_node: str | None = None  # SDPA: Mul(Q, s_q) with Mul(K^T, s_k)
    k_scale_node: str | None = None
    # Gemma-2's soft-capping of the scaled scores, c * tanh(s / c): Div (or Mul by 1 / c),
    # Tanh, Mul by c; the op's ``softcap`` applies it where the scores have it, before
    # the mask (both onnxruntime's kernel and ONNX Attention do, measured).
    softcap_in_node: str | None = None
    softcap_out_node: str | None = None
    mask_node: str = "mask"  # Add of the additive mask
    # gpt-oss's attention sinks: Concat(scores, E) before the Softmax, Slice [..., :-1]
    # after it; the kernel's head_sink (``_sink``)
    sink_concat_node: str | None = None
    sink_slice_node: str | None = None
    nan_guard_node: str | None = None  # SDPA: Where(IsNaN(P), 0, P)
    output_node: str = "out_reshape"


class GroupQueryAttention(Rewriter):
    name = "group_query_attention"
    targets = frozenset({"onnxruntime", "generic"})
    Params = GQAParams

    def __init__(self, *, pad_values: bool = False) -> None:
        # value heads narrower than the query's padded to its head size (``_narrow_values``)
        self.pad_values = pad_values

    def rewrite(self, match: Match, params: GQAParams, ctx: RewriteContext) -> Rewrite | str:
        proof = FusedSizeProof()  # one walk for every size this rewrite relies on
        query = split_source(match.node(params.q_transpose_node).outputs[0], "query", proof)
        if isinstance(query, str):
            return query
        q, (heads, size) = query
        sides = _kv_sides(match, params, (q, heads), proof, narrow=self.pad_values)
        if isinstance(sides, str):
            return sides
        key, value = sides
        past = past_of(key.past, proof)
        output = match.node(params.output_node)
        layout = merged_layout(match, params, q, (heads, value.size), proof)
        if isinstance(layout, str):
            return layout
        reshape_after, scale = layout
        softcap = _softcap(match, params)
        if isinstance(softcap, str):
            return softcap
        contrib = ctx.target.can_emit(MS_DOMAIN)
        if contrib and size % _KERNEL_SIZE_STEP:
            return _head_size_refusal(size)
        if not contrib and ctx.opset < ATTENTION_OPSET:
            return opset_refusal("ONNX Attention", ATTENTION_OPSET, ctx)
        sinks = _sinks(match, params, (heads, q, proof), ctx, contrib=contrib)
        if isinstance(sinks, str):
            return sinks
        masked = _mask(match, params, (q, key, past), heads, ctx, need_causal=contrib)
        if isinstance(masked, str):
            return masked
        nodes = [*(sinks[1] if sinks else []), *masked.nodes]
        padded = padded_values(value, size, ctx, nodes, contrib=contrib)  # value where Hv = H
        if isinstance(padded, str):
            return padded
        if contrib:
            sides, sink = (key, padded, past), sinks[0] if sinks else None
            gqa = _group_query_attention(q, sides, masked, (heads, scale), ctx, nodes, sink)
        else:
            gqa = _onnx_attention(q, key, padded, masked.bias, (heads, scale), nodes)
        if softcap:
            gqa.attributes["softcap"] = ir.AttrFloat32("softcap", softcap)
        if masked.window is not None:
            gqa.attributes["local_window_size"] = ir.AttrInt64("local_window_size", masked.window)
        nodes.append(gqa)
        _like(gqa.outputs[0], q)
        replaced = _presents((key, value), gqa)
        _empty_rows(masked, gqa, (q, heads // key.heads), ctx, nodes)
        if not contrib and masked.keep is None and masked.bias is not None:
            _generic_empty_rows(masked.bias, gqa, value, heads, ctx, nodes)
        if padded is not value:  # each head's first Hv columns
            narrowed_context(nodes[-1].outputs[0], heads, (size, value.size), ctx, nodes)
        if reshape_after:
            nodes.append(_reshaped_as(nodes[-1].outputs[0], output))
        old = output.outputs[0]
        _like(nodes[-1].outputs[0], old)
        record_sizes(nodes[-1], old, proof)  # a later layer's proof reads through it
        notes = [masked.note] if masked.note else []
        return Rewrite(nodes, [(old, nodes[-1].outputs[0]), *replaced], notes=notes)


def _presents(sides: tuple[KVSide, KVSide], gqa: ir.Node) -> list[tuple[ir.Value, ir.Value]]:
    """The graph's present key and value, each with the fused op's output replacing it."""
    replaced = []
    for side, new in zip(sides, gqa.outputs[1:], strict=False):
        if side.present is not None:
            _like(new, side.present)
            replaced.append((side.present, new))
    return replaced


def _head_size_refusal(size: int) -> str:
    return (
        f"the heads are {size} wide: GroupQueryAttention takes a head size that is a"
        f" multiple of {_KERNEL_SIZE_STEP} (onnxruntime's kernel refuses others)"
    )


def _reshaped_as(merged: ir.Value, output: ir.Node) -> ir.Node:
    """The matched output Reshape (target and attributes) of the fused op's output."""
    return ir.Node("", "Reshape", [merged, output.inputs[1]], output.attributes.values())


def _sinks(
    match: Match,
    params: GQAParams,
    query: tuple[int, ir.Value, SizeProof],
    ctx: RewriteContext,
    *,
    contrib: bool,
) -> tuple[ir.Value, list[ir.Node]] | str | None:
    """The ``[heads]`` attention sinks and the nodes computing them (None without
    sinks), or why the kernel cannot take them; ``query``: the heads, the query and the
    proof of sizes."""
    heads, q, proof = query
    if params.sink_concat_node is None or params.sink_slice_node is None:
        return None
    if not contrib:
        return (
            "ONNX Attention has no input for attention sinks (a logit per head in the "
            "softmax's denominator): only com.microsoft GroupQueryAttention's head_sink takes them"
        )
    names = (params.sink_concat_node, params.sink_slice_node)
    return head_sink(match, names, (heads, q.dtype), ctx, proof)


def _empty_rows(
    masked: EmptyRows,
    gqa: ir.Node,
    q_and_groups: tuple[ir.Value, int],
    ctx: RewriteContext,
    nodes: list[ir.Node],
) -> None:
    """What a row with nothing to attend to gets, after the kernel: 0 (multiplied by
    the rows to keep) or the cache's mean value (picked), as the graph computes it; the
    mean, which reads the whole value cache, only when some row is empty
    (``_empty_rows_guard``: a decode step's query never is)."""
    q, groups = q_and_groups
    if masked.keep is None:
        return
    if masked.empty_rows == "mean":
        kept = every_row_kept(masked.keep, ctx, nodes)
        fix: list[ir.Node] = []
        mean = _mean_value(gqa.outputs[2], groups, ctx, fix)
        fix.append(ir.Node("", "Where", [masked.keep, gqa.outputs[0], mean]))
        nodes.append(unless_every_row_attends(kept, fix, gqa.outputs[0], ctx))
    else:
        nodes.append(ir.Node("", "Mul", [gqa.outputs[0], masked.keep]))
    _like(nodes[-1].outputs[0], q)


def _softcap(match: Match, params: GQAParams) -> float | str:
    """``c`` of the matched ``c * tanh(s / c)`` (0.0 without one), or why it is not one:
    the scale into the Tanh must be the inverse of the scale out of it."""
    if params.softcap_in_node is None or params.softcap_out_node is None:
        return 0.0
    into = scale_factor(match.node(params.softcap_in_node), match.input(params.softcap_in_node, 1))
    out = scale_factor(match.node(params.softcap_out_node), match.input(params.softcap_out_node, 1))
    if isinstance(into, str) or isinstance(out, str):
        return into if isinstance(into, str) else out  # type: ignore[return-value]
    if out <= 0 or not np.isclose(into * out, 1.0, rtol=1e-6, atol=0):
        return (
            f"the scores' tanh is scaled by {into:g} in and {out:g} out: "
            "not a soft-cap c * tanh(s / c) with one c > 0"
        )
    return out


def _generic_empty_rows(
    bias: ir.Value,
    attention: ir.Node,
    value: KVSide,
    heads: int,
    ctx: RewriteContext,
    nodes: list[ir.Node],
) -> None:
    """ONNX Attention's rows the mask covers everywhere as the graph computes them, the
    mean of the values over every key (``empty_rows_as_mean``), computed only when the
    mask has such a row (``_empty_rows_guard``); the nodes into ``nodes``."""
    if attention.outputs[0].dtype != ir.DataType.FLOAT:
        return  # float16: nothing put back (``empty_rows_as_mean`` says why)
    attends = every_row_attends(bias, ctx, nodes)
    fix: list[ir.Node] = []
    mean = _values_mean(attention, value, heads // value.heads, ctx, fix)
    mean.dtype = attention.outputs[0].dtype
    fix += empty_rows_as_mean(bias, mean, attention.outputs[0], (heads, value.size), ctx)
    nodes.append(unless_every_row_attends(attends, fix, attention.outputs[0], ctx))
    _like(nodes[-1].outputs[0], attention.outputs[0])


def _values_mean(
    attention: ir.Node, value: KVSide, groups: int, ctx: RewriteContext, nodes: list[ir.Node]
) -> ir.Value:
    """``[B, 1, N * H]``: each query head's mean of its KV head's values over every key
    (of the present cache, or of the new values without one); the nodes into ``nodes``."""
    if value.past is not None:
        mean = _mean_value(attention.outputs[2], groups, ctx, nodes)
    else:  # [B, L, kv_heads * H]: its heads' means, each repeated for its query heads
        layout = ctx.initializer("gqa_value_heads", np.array([0, 1, value.heads, 1, value.size]))
        keys = ctx.initializer("gqa_value_keys", np.array([1], np.int64))
        averaged = ir.Node("", "ReduceMean", [value.new, keys], [ir.AttrInt64("keepdims", 1)])
        split = ir.Node("", "Reshape", [averaged.outputs[0], layout])
        repeat = ctx.initializer("gqa_value_repeat", np.array([1, 1, 1, groups, 1], np.int64))
        grown = ir.Node("", "Expand", [split.outputs[0], repeat])
        merged = ctx.initializer("gqa_value_mean_shape", np.array([0, 1, -1], np.int64))
        row = ir.Node("", "Reshape", [grown.outputs[0], merged])
        nodes += [averaged, split, grown, row]
        mean = row.outputs[0]
    return mean


def _mean_value(
    present: ir.Value, groups: int, ctx: RewriteContext, nodes: list[ir.Node]
) -> ir.Value:
    """``[B, 1, N * H]``: each query head's average over every key of its (repeated) KV
    head's values, what a finite mask's row with nothing to attend to computes."""
    if ctx.opset >= 18:
        axes = ctx.initializer("gqa_key_rows", np.array([2], np.int64))
        mean = ir.Node("", "ReduceMean", [present, axes], [ir.AttrInt64("keepdims", 1)])
    else:
        attrs = [ir.AttrInt64s("axes", [2]), ir.AttrInt64("keepdims", 1)]
        mean = ir.Node("", "ReduceMean", [present], attrs)
    heads_axis = ctx.initializer("gqa_heads_axis", np.array([2], np.int64))
    split = ir.Node("", "Unsqueeze", [mean.outputs[0], heads_axis])
    repeat = ctx.initializer("gqa_repeat", np.array([1, 1, groups, 1, 1], np.int64))
    grown = ir.Node("", "Expand", [split.outputs[0], repeat])
    merged = ctx.initializer("gqa_mean_shape", np.array([0, 1, -1], np.int64))
    row = ir.Node("", "Reshape", [grown.outputs[0], merged])
    nodes += [mean, split, grown, row]
    row.outputs[0].dtype = present.dtype
    return row.outputs[0]


def _group_query_attention(
    q: ir.Value,
    sides: tuple[KVSide, KVSide, Past],
    masked: EmptyRows,
    heads_and_scale: tuple[int, float],
    ctx: RewriteContext,
    nodes: list[ir.Node],
    sink: ir.Value | None,
) -> ir.Node:
    """com.microsoft GroupQueryAttention with the lengths it needs (and the sinks)."""
    (key, value, past), (heads, scale) = sides, heads_and_scale
    lengths = lengths_of(q, key, ctx, nodes, past)
    inputs: list[ir.Value | None] = [q, key.new, value.new, key.past, value.past, *lengths[:2]]
    inputs += [None] * (_BIAS_INPUT - len(inputs)) + [masked.bias]
    if sink is not None:
        inputs.append(sink)  # input 11, head_sink
    if key.past is not None:  # batches of several new tokens with a cache need it
        inputs += [None] * (_QUERY_SEQLENS_INPUT - len(inputs)) + [lengths[2]]
    attrs = [
        ir.AttrInt64("num_heads", heads),
        ir.AttrInt64("kv_num_heads", key.heads),
        ir.AttrFloat32("scale", scale),
        ir.AttrInt64("causal", int(masked.causal)),
    ]
    ctx.use_domain(MS_DOMAIN)
    return ir.Node(MS_DOMAIN, "GroupQueryAttention", inputs, attrs, num_outputs=3)


def _onnx_attention(
    q: ir.Value,
    key: KVSide,
    value: KVSide,
    bias: ir.Value,
    heads_and_scale: tuple[int, float],
    nodes: list[ir.Node],
) -> ir.Node:
    """ONNX Attention (opset 23): the same 3-D q, k, v, the mask as ``attn_mask``, the
    cache as ``past_key``/``past_value`` (it appends the new keys itself), not causal:
    the mask says everything."""
    heads, scale = heads_and_scale
    inputs: list[ir.Value | None] = [q, key.new, value.new, bias]
    if key.past is not None:
        inputs += [key.past, value.past]
    attrs = [
        ir.AttrInt64("q_num_heads", heads),
        ir.AttrInt64("kv_num_heads", key.heads),
        ir.AttrFloat32("scale", scale),
    ]
    return ir.Node("", "Attention", inputs, attrs, num_outputs=3 if key.past is not None else 1)


def _kv_sides(
    match: Match,
    params: GQAParams,
    query: tuple[ir.Value, int],
    proof: SizeProof,
    *,
    narrow: bool = False,
) -> tuple[KVSide, KVSide] | str:
    """Key and value, their caches, and the proof that repeat_kv (if any) maps query
    head ``n`` to KV head ``n // (heads / kv_heads)`` as GroupQueryAttention does;
    ``query``: the ``[B, S, heads * H]`` query and ``heads``; ``narrow``: value heads
    narrower than the key's are taken (to be padded)."""
    q, heads = query
    sides = []
    for what, free in (("key", "$k"), ("value", "$v")):
        side = kv_side(match.value(free), what, proof)
        if isinstance(side, str):
            return side
        sides.append(side)
    key, value = sides
    if (key.past is None) != (value.past is None):
        return "only one of key and value has a past: not a KV cache GroupQueryAttention takes"
    lengths = [proof.size(v, 1) for v in (key.new, q)]
    if not same_size(*lengths):
        return (
            f"the new key {key.new.name!r} must be as long as the query {q.name!r} and is "
            f"not proven so ({said(lengths[0])} against {said(lengths[1])}): a key computed "
            "from a cache of another kind (a latent) or another sequence is not a cache of keys"
        )
    padded = narrow and value.size < key.size
    if key.heads != value.heads or (key.size != value.size and not padded):
        return (
            f"key ({key.heads} x {key.size}) and value ({value.heads} x {value.size}) heads differ"
        )
    if heads % key.heads:
        return f"{heads} query heads do not share {key.heads} KV heads evenly"
    groups = heads // key.heads
    repeats = (
        (params.k_unsqueeze_node, params.k_expand_node, params.k_repeat_node),
        (params.v_unsqueeze_node, params.v_expand_node, params.v_repeat_node),
    )
    for names in repeats:
        if None in names:
            # One KV head needs no repeat: the MatMuls broadcast it to every query head
            # (multi-query attention: Falcon), which is GroupQueryAttention's kv_num_heads=1.
            if groups != 1 and key.heads != 1:
                return f"{heads} query heads read {key.heads} KV heads without a repeat_kv"
            continue
        repeat = [match.node(n) for n in names]  # type: ignore[arg-type]
        failure = repeats_heads(repeat, groups, proof)
        if failure is not None:
            return failure
    return key, value


class EmptyRows(NamedTuple):
    """The mask as the kernel takes it, and what a row with nothing to attend to gets."""

    bias: ir.Value | None
    keep: ir.Value | None  # [B, S, 1], None when no row can be empty
    causal: bool
    nodes: list[ir.Node]
    empty_rows: str = "zero"  # "zero": multiply by keep; "mean": the cache's mean value
    window: int | None = None  # local_window_size: the sliding window the kernel applies
    note: str | None = None  # why a sliding window stays in the bias (a near miss)


def _mask(
    match: Match,
    params: GQAParams,
    sides: tuple[ir.Value, KVSide, Past],
    heads: int,
    ctx: RewriteContext,
    *,
    need_causal: bool,
) -> EmptyRows | str:
    """The attention bias, the rows to fix after, causal or not and the nodes computing
    them, or why the mask cannot be given to GroupQueryAttention.

    GroupQueryAttention with a cache needs ``causal = 1`` (the CPU kernel refuses a batch
    of several new tokens each otherwise), which is exact only if the mask is causal and
    a row with nothing to attend to gives 0 in both graphs: the SDPA NaN guard over a
    ``-inf`` mask, turned into the keep-rows multiply. A finite mask gives a fully masked
    row the average of every key: with ``causal = 0`` (without a cache) as it is, with
    ``causal = 1`` by picking those rows from the cache's mean value. With attention
    sinks such a row is 0 in the graph and in the kernel (the sink takes its whole
    weight, and no row is NaN): nothing to fix after. ``sides``: the query, the key and
    ``P``."""
    q, key, past = sides
    add = match.node(params.mask_node)
    # the scores the mask is added to: after the soft-cap, the scale, or Q @ K^T itself
    scores = params.softcap_out_node or params.scale_node or params.qk_node
    mask = attention_bias(add, match.node(scores), "GroupQueryAttention")
    if isinstance(mask, str):
        return mask
    sink = params.sink_concat_node is not None
    allowed = allowed_of(mask)
    summed = None
    if isinstance(allowed, str) and need_causal and not sink:  # a sum of two masks
        summed = summed_mask(mask, past)
        if isinstance(summed, SummedMask):  # the whole sum is the bias; no row to fix
            bias, nodes = _halved(mask, ctx) if summed.halved else (mask, [])
            return EmptyRows(bias, None, True, nodes, window=summed.window, note=summed.note)
    shared = (
        None
        if isinstance(allowed, str)
        else shared_bias(
            mask, allowed, ctx, q, key, past=past, causal_kernel=need_causal, sink=sink
        )
    )
    zero_rows = shared is not None and shared.keep is not None and shared.empty_rows == "zero"
    if zero_rows and params.nan_guard_node is None:
        return (
            f"the mask {mask.name!r} holds -inf and no NaN guard follows the Softmax: "
            "a fully masked row is NaN"
        )
    if shared is not None and shared.causal_only:  # the bias: the terms besides the causal
        return EmptyRows(
            shared.bias, shared.keep, True, shared.nodes, shared.empty_rows, shared.window
        )
    whole = _whole_mask(mask, shared, match, params, ctx)
    mean_rows = shared is not None and not isinstance(allowed, str) and not sink
    shape = (key, past, heads, need_causal)
    if not isinstance(whole, str):
        whole = _causal_or_not(whole, mask, allowed, shape, ctx, mean_rows, sink=sink)
    # a sum of two masks the proof refused: its reason says more than the single mask's
    return summed if isinstance(whole, str) and isinstance(summed, str) else whole


def _whole_mask(
    mask: ir.Value,
    shared: MaskBias | None,
    match: Match,
    params: GQAParams,
    ctx: RewriteContext,
) -> EmptyRows | str:
    """The whole mask as the bias (not yet causal), the rows to keep and the nodes
    computing them, or why a fully masked row cannot be matched."""
    if shared is not None:
        return EmptyRows(shared.bias, shared.keep, False, shared.nodes, note=shared.note)
    if params.nan_guard_node is not None:
        guarded = guarded_mask(mask, match.node(params.nan_guard_node), ctx)
        if isinstance(guarded, str):
            return guarded
        return EmptyRows(guarded[0], guarded[1], False, list(guarded[2]))
    if params.sink_concat_node is None:  # with sinks even a -inf row is 0, never NaN
        finite = _finite_where(mask)
        if finite is not None:
            return finite
    return EmptyRows(mask, None, False, [])


def _causal_or_not(
    masked: EmptyRows,
    mask: ir.Value,
    allowed: ir.Value | str,
    shape: tuple[KVSide, Past, int, bool],
    ctx: RewriteContext,
    mean_rows: bool,
    *,
    sink: bool,
) -> EmptyRows | str:
    """The whole mask as the bias: causal where it is proven causal (and its empty rows
    handled), not causal without a cache, else why not. ``shape``: the key side, ``P``,
    the query heads and whether the kernel must be causal."""
    key, past, heads, need_causal = shape
    why = allowed if isinstance(allowed, str) else causal_failure(allowed, past)
    if why is None and (masked.keep is not None or sink):  # empty rows: 0 in both
        return masked._replace(causal=True)
    if key.past is None and why is not None and key.heads == heads and not sink:
        return (  # no decoder's sign
            f"neither a KV cache, grouped KV heads nor a causal mask ({why}): an encoder's "
            "attention: MultiHeadAttention's"
        )
    if key.past is None or not need_causal:
        return masked
    if why is None and mean_rows:  # finite, causal: the empty rows take the mean
        keep = any_key_rows(allowed, ctx, masked.nodes, past.proof)  # type: ignore[arg-type]
        return masked._replace(keep=keep, causal=True, empty_rows="mean")
    if why is None:
        why = (
            f"the mask {mask.name!r} is finite: a fully masked row averages every key, "
            "which causal attention does not"
        )
    return f"with a KV cache GroupQueryAttention must be causal, and {why}"


def _halved(mask: ir.Value, ctx: RewriteContext) -> tuple[ir.Value, list[ir.Node]]:
    """``0.5 * mask``: no level the lowest float, which the kernel reads as no key at all
    (``_summed``)."""
    half = ir.Node("", "Mul", [mask, ctx.initializer("gqa_half", np.array(0.5, np.float32))])
    _like(half.outputs[0], mask)
    return half.outputs[0], [half]


def _finite_where(mask: ir.Value) -> str | None:
    """Why ``mask`` is not ``Where(cond, a, b)`` of finite constants, or None."""
    producer = mask.producer()
    arrays = (
        [constant_array(v) for v in producer.inputs[1:]]
        if producer is not None and producer.op_type == "Where"
        else [None]
    )
    if any(a is None for a in arrays) or not all(np.all(np.isfinite(a)) for a in arrays):
        return (
            f"the mask {mask.name!r} is not Where of finite constants: a fully masked row "
            "(-inf) gives NaN, which GroupQueryAttention does not"
        )
    return None


def _like(value: ir.Value, source: ir.Value) -> None:
    value.type, value.shape = source.type, source.shape
