"""``attention``: the rewriter (the math, and what it proves, is in the package's docstring)."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._attention_mask import (
    attention_bias,
    empty_rows_as_mean,
    expand_queries,
    guarded_mask,
)
from autofusion.fusion_core.rewriters._attention_shapes import heads_of, merged_layout
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
)
from autofusion.fusion_core.rewriters._empty_rows_guard import (
    every_row_attends,
    unless_every_row_attends,
)
from autofusion.fusion_core.rewriters._fused_sizes import FusedSizeProof, same_axis
from autofusion.fusion_core.rewriters._mask_sizes import shown_sizes
from autofusion.fusion_core.sizes import SizeProof
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["FuseAttention", "attention_of", "multi_head_attention"]

ATTENTION_OPSET = 23  # https://onnx.ai/onnx/operators/onnx__Attention.html


class AttentionParams(Params):
    q_reshape_node: str = "q_reshape"
    k_reshape_node: str = "k_reshape"
    v_reshape_node: str = "v_reshape"
    qk_node: str = "qk"  # MatMul(Q, K^T)
    scale_node: str | None = "scale"  # Mul by c or Div by c
    q_scale_node: str | None = None  # SDPA: Mul(Q, s_q) (with k_scale_node)
    k_scale_node: str | None = None  # SDPA: Mul(K^T, s_k)
    k_flat_node: str | None = None  # SDPA: Reshape of K to [B * N, L, H]
    k_unflat_node: str | None = None  # SDPA: Reshape of its transpose to [B, N, H, L]
    nan_guard_node: str | None = None  # SDPA: Where(IsNaN(P), 0, P) after the Softmax
    mask_node: str | None = None  # Add of the additive mask
    output_node: str = "out_reshape"  # the Reshape back to [B, S, N * H]


class FuseAttention(Rewriter):
    name = "attention"
    targets = frozenset({"onnxruntime", "generic"})
    Params = AttentionParams

    def rewrite(self, match: Match, params: AttentionParams, ctx: RewriteContext) -> Rewrite | str:
        splits = [
            match.node(params.q_reshape_node),
            match.node(params.k_reshape_node),
            match.node(params.v_reshape_node),
        ]
        return multi_head_attention(match, params, splits, ctx)


def multi_head_attention(
    match: Match, params: Any, splits: list[ir.Node], ctx: RewriteContext
) -> Rewrite | str:
    """The matched attention as MultiHeadAttention (ONNX Attention on the generic
    target), ``splits`` the Reshapes of q, k and v into heads (in the match or not:
    ``attention_block`` reads k's and v's before the match), or why not. ``params``
    names the matched nodes as ``AttentionParams`` does."""
    contrib = ctx.target.can_emit(MS_DOMAIN)
    if not contrib and ctx.opset < ATTENTION_OPSET:
        instead = "the generic target folds the attention scale into the projection instead"
        return opset_refusal("ONNX Attention", ATTENTION_OPSET, ctx, instead)
    proof = FusedSizeProof()  # one per rewrite: the sizes every step below decides on
    heads = _heads(splits, proof)
    if isinstance(heads, str):
        return heads
    (count, _), value_size = heads
    inputs: list[ir.Value | None] = [s.inputs[0] for s in splits]
    return attention_of(match, params, inputs, (count, value_size), ctx, proof=proof)


def attention_of(
    match: Match,
    params: Any,
    inputs: list[ir.Value | None],
    heads: tuple[int, int],
    ctx: RewriteContext,
    before: list[ir.Node] | None = None,
    *,
    proof: SizeProof | None = None,
) -> Rewrite | str:
    """The fused op over ``inputs`` (q ``[B, S, N * H]``, and k and v as the op takes
    them), ``heads`` (N, the value's head size), after the nodes ``before`` that compute
    k and v, in place of the matched block's output; or why not (batch, layout, scale,
    mask). ``proof``: the rewrite's sizes (a new ``FusedSizeProof`` without one)."""
    contrib = ctx.target.can_emit(MS_DOMAIN)
    count, value_size = heads
    output = match.node(params.output_node)
    proof = proof if proof is not None else FusedSizeProof()
    unbatched = _batch_refusal(inputs, proof)
    if unbatched is not None:
        return unbatched
    layout = merged_layout(match, params, inputs[0], (count, value_size), proof)  # type: ignore[arg-type]
    if isinstance(layout, str):
        return layout
    reshape_after, scale = layout
    masked = _mask(match, params, ctx)
    if isinstance(masked, str):
        return masked
    mask, keep_rows, mask_nodes = masked
    nodes = [*(before or []), *mask_nodes]
    inputs = list(inputs)
    if mask is not None:
        inputs += [None, None, mask]
    nodes.append(_attention_node(contrib, inputs, count, scale, ctx))
    q = inputs[0]
    assert q is not None
    # [B, S, N * Dv]: the query's batch and sequence, the value's head size
    merged = ir.Shape([*q.shape[:2], count * value_size]) if q.shape is not None else None
    nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = q.type, merged
    if keep_rows is not None:
        nodes.append(ir.Node("", "Mul", [nodes[-1].outputs[0], keep_rows]))
        nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = q.type, merged
    elif mask is not None and not contrib and inputs[2] is not None:
        _guarded_empty_rows(mask, inputs[2], (count, value_size), ctx, nodes)
        nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = q.type, merged
    if reshape_after:
        reshape = [nodes[-1].outputs[0], output.inputs[1]]
        nodes.append(ir.Node("", "Reshape", reshape, output.attributes.values()))
    old = output.outputs[0]
    new = nodes[-1].outputs[0]
    new.type, new.shape = old.type, old.shape
    return Rewrite(nodes, [(old, new)])


def _guarded_empty_rows(
    mask: ir.Value,
    value: ir.Value,
    heads: tuple[int, int],
    ctx: RewriteContext,
    nodes: list[ir.Node],
) -> None:
    """ONNX Attention's rows the mask covers everywhere as the graph computes them, the
    mean of the values (``empty_rows_as_mean``), read only when the mask has such a row
    (``_empty_rows_guard``); after the attention, ``nodes[-1]``."""
    attention = nodes[-1].outputs[0]
    keys = ctx.initializer("empty_rows_keys", np.array([1], np.int64))
    mean = ir.Node("", "ReduceMean", [value, keys], [ir.AttrInt64("keepdims", 1)])
    empty = empty_rows_as_mean(mask, mean.outputs[0], attention, heads, ctx)
    if not empty:  # float16: nothing put back (``empty_rows_as_mean`` says why)
        return
    attends = every_row_attends(mask, ctx, nodes)
    nodes.append(unless_every_row_attends(attends, [mean, *empty], attention, ctx))


def _batch_refusal(inputs: list[ir.Value | None], proof: SizeProof) -> str | None:
    """Why the key or value may have another batch than the query, or None. The graph's
    MatMuls broadcast a key of batch 1 against the queries' B; the fused op's kernel
    takes one batch for all three (proven, or labelled alike where sizes cannot tell)."""
    query = inputs[0]
    for what, value in zip(("key", "value"), inputs[1:3], strict=False):
        if value is not None and not same_axis(proof, (value, 0), (query, 0)):
            names = [v.name if v is not None else None for v in (value, query)]
            sizes = shown_sizes([proof.size(value, 0), proof.size(query, 0)])
            return (
                f"the {what} {names[0]!r} (batch {sizes[0]}) is not proven to have the batch "
                f"of the query {names[1]!r} ({sizes[1]}): the graph broadcasts a batch of 1, "
                "the fused op does not"
            )
    return None


def _heads(splits: list[ir.Node], proof: SizeProof) -> tuple[tuple[int, int], int] | str:
    """((N, H) of the query and key, the value's head size), or why not: the value may
    have a head size of its own (multi-head latent attention), its heads must be N."""
    heads = heads_of(splits[:2], proof)
    if isinstance(heads, str):
        return heads
    value = heads_of(splits[2:], proof)
    if isinstance(value, str):
        return value
    if value[0] != heads[0]:
        return f"the value has {value[0]} heads, the query and key {heads[0]}"
    return heads, value[1]


def _mask(
    match: Match, params: Any, ctx: RewriteContext
) -> tuple[ir.Value | None, ir.Value | None, list[ir.Node]] | str:
    """(the additive mask, the rows to zero after, the nodes that compute them), or why
    the mask cannot be given to the fused op."""
    if params.mask_node is None:
        return None, None, []
    scores = match.node(params.scale_node or params.qk_node)
    mask = attention_bias(match.node(params.mask_node), scores, one_query=True)
    if isinstance(mask, str):
        return mask
    keep_rows, mask_nodes = None, []
    if params.nan_guard_node is not None:
        guarded = guarded_mask(mask, match.node(params.nan_guard_node), ctx)
        if isinstance(guarded, str):
            return guarded
        mask, keep_rows, mask_nodes = guarded
    # one row for every query (nn.MultiheadAttention's key padding): a row per query
    mask, expanded = expand_queries(mask, match.input(params.q_reshape_node, 0), ctx)
    return mask, keep_rows, [*mask_nodes, *expanded]


def _attention_node(
    contrib: bool, inputs: list[ir.Value | None], heads: int, scale: float, ctx: RewriteContext
) -> ir.Node:
    """com.microsoft MultiHeadAttention, or ONNX Attention: the same 3-D q, k, v, the
    additive mask (MultiHeadAttention's input 5, Attention's input 3) and scale."""
    if contrib:
        ctx.use_domain(MS_DOMAIN)
        attrs = [ir.AttrInt64("num_heads", heads), ir.AttrFloat32("scale", scale)]
        return ir.Node(MS_DOMAIN, "MultiHeadAttention", inputs, attrs)
    attrs = [
        ir.AttrInt64("q_num_heads", heads),
        ir.AttrInt64("kv_num_heads", heads),
        ir.AttrFloat32("scale", scale),
    ]
    return ir.Node("", "Attention", [v for v in inputs if v is not None], attrs)
