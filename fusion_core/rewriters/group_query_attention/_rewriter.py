"""``group_query_attention``: the rewriter (the math, and what it proves, is in the
package's docstring). Each rewrite proves the sizes it relies on (the query's and the
key's lengths, the past length, repeat_kv's shapes) with one ``FusedSizeProof``
(``rewriters/_fused_sizes.py``, ``_proven``), and marks its last node with the sizes of
the value it replaces (``record_sizes``) for the next layer's proof. What it reads is
traced in ``_inputs``, the mask in ``_mask``, the rows with nothing to attend to in
``_empty_rows``."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._attention_shapes import merged_layout
from autofusion.fusion_core.rewriters._base import (
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
    scale_factor,
)
from autofusion.fusion_core.rewriters._fused_sizes import FusedSizeProof, record_sizes
from autofusion.fusion_core.rewriters.group_query_attention._empty_rows import (
    empty_rows,
    generic_empty_rows,
)
from autofusion.fusion_core.rewriters.group_query_attention._inputs import (
    KVSide,
    kv_sides,
    split_source,
)
from autofusion.fusion_core.rewriters.group_query_attention._lengths import lengths_of
from autofusion.fusion_core.rewriters.group_query_attention._mask import EmptyRows, like, mask_of
from autofusion.fusion_core.rewriters.group_query_attention._narrow_values import (
    narrowed_context,
    padded_values,
)
from autofusion.fusion_core.rewriters.group_query_attention._params import GQAParams
from autofusion.fusion_core.rewriters.group_query_attention._proven import Past, past_of
from autofusion.fusion_core.rewriters.group_query_attention._sink import head_sink
from autofusion.fusion_core.sizes import SizeProof
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["GQAParams", "GroupQueryAttention"]

ATTENTION_OPSET = 23  # https://onnx.ai/onnx/operators/onnx__Attention.html
_BIAS_INPUT = 10  # attention_bias
_QUERY_SEQLENS_INPUT = 16  # query_seqlens


_KERNEL_SIZE_STEP = 8  # onnxruntime: "head_size must be a multiple of 8"


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
        sides = kv_sides(match, params, (q, heads), proof, narrow=self.pad_values)
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
        masked = mask_of(match, params, (q, key, past), heads, ctx, need_causal=contrib)
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
        like(gqa.outputs[0], q)
        replaced = _presents((key, value), gqa, q)
        empty_rows(masked, gqa, (q, heads // key.heads), ctx, nodes)
        if not contrib and masked.keep is None and masked.bias is not None:
            generic_empty_rows(masked.bias, gqa, value, heads, ctx, nodes)
        if padded is not value:  # each head's first Hv columns
            narrowed_context(nodes[-1].outputs[0], heads, (size, value.size), ctx, nodes)
        if reshape_after:
            nodes.append(_reshaped_as(nodes[-1].outputs[0], output))
        old = output.outputs[0]
        like(nodes[-1].outputs[0], old)
        record_sizes(nodes[-1], old, proof)  # a later layer's proof reads through it
        notes = [masked.note] if masked.note else []
        return Rewrite(nodes, [(old, nodes[-1].outputs[0]), *replaced], notes=notes)


def _presents(
    sides: tuple[KVSide, KVSide], gqa: ir.Node, q: ir.Value
) -> list[tuple[ir.Value, ir.Value]]:
    """The graph's present key and value, each with the fused op's output replacing it;
    without a cache, the outputs no one reads typed ``[B, kv_heads, L, H]`` all the same
    (a value the rewrite makes has a type: ``_new_types``)."""
    replaced = []
    for side, new in zip(sides, gqa.outputs[1:], strict=False):
        if side.present is not None:
            like(new, side.present)
            replaced.append((side.present, new))
        else:
            new.type = side.new.type
            batch = q.shape[0] if q.shape is not None and len(q.shape) else None
            new.shape = ir.Shape([batch, side.heads, None, side.size])
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
