"""``attention_block``: the one attention recognizer. The ``attention`` pattern binds
the block in the canonical form (its repeat_kv, soft-cap, mask and NaN guard each
optional); this rewriter decides what the block is and emits the best op the target
has for it:

* ``GroupQueryAttention`` (com.microsoft; ONNX ``Attention`` on the generic target at
  opset 23) where a decoder's attention reads it: query heads sharing KV heads
  (repeat_kv, or one KV head broadcast), a KV cache (the heads are a
  ``Concat(past, new)``), a soft-cap, attention sinks (gpt-oss: its ``head_sink``, which
  neither MultiHeadAttention nor ONNX Attention has), or a mask proven causal
  (``group_query_attention``, which proves each; a causal mask summed with a causal
  padding mask too, GPT-Neo's: ``_summed``);
* ``MultiHeadAttention`` (com.microsoft; ONNX ``Attention``) for the rest: an encoder's
  attention, or a decoder's without a cache where its mask rides along as the bias
  (``attention``), when the key and value heads are head splits of ``[B, L, N * H]``
  that nothing else reads;
* ``MultiHeadAttention`` over the repeated key/value heads where the heads are grouped
  but GroupQueryAttention cannot take the block: a mask computed from the values (not
  causal, not a Where of finite constants), a value head size of its own
  (``attention``'s ``grouped_multi_head_attention``), and over ``[B, N, L, H]`` key
  and value heads as they are where they are no head split (heads repeated in block
  order by a Tile: JetMoE's mixture of attention heads); ONNX ``Attention`` over the
  same heads on the generic target at opset 23;
* GroupQueryAttention over value heads padded with zeros to the query's head size, the
  context cut back (``group_query_attention``'s ``_narrow_values``: exact), where value
  heads narrower than the key's kept every op above from the block (MiMo-V2-Flash's
  sliding layers: sinks) and there is no KV cache;
* else a near miss naming, for each op, the step that failed.

Without grouped heads, a soft-cap or a cache, MultiHeadAttention is tried first (the
mask stays the bias, exact for any mask) and GroupQueryAttention after.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.ir import consumers
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._attention_shapes import HeadNodes
from autofusion.fusion_core.rewriters._base import Rewrite, RewriteContext, Rewriter
from autofusion.fusion_core.rewriters._effect import RewriteEffect, matched
from autofusion.fusion_core.rewriters.attention import (
    AttentionParams,
    grouped_multi_head_attention,
    multi_head_attention,
)
from autofusion.fusion_core.rewriters.group_query_attention import (
    GQAParams,
    GroupQueryAttention,
    head_split,
    narrow_values,
)
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["AttentionBlock"]


class AttentionBlockParams(HeadNodes):
    k_transpose_node: str = "k_t"  # K^T
    qk_node: str = "qk"  # MatMul(Q, K^T)
    scale_node: str = "scale"  # Mul or Div of the scores by a constant
    softcap_in_node: str | None = None  # c * tanh(s / c): Div (or Mul by 1 / c), Tanh, Mul
    softcap_out_node: str | None = None
    mask_node: str | None = None  # Add of the additive mask
    sink_concat_node: str | None = None  # gpt-oss's sinks: Concat(scores, E) before the Softmax
    sink_slice_node: str | None = None  # and their column dropped after it
    nan_guard_node: str | None = None  # Where(IsNaN(P), 0, P)
    context_node: str = "context"  # P @ V
    output_node: str = "out_reshape"


_GQA_FIELDS = set(GQAParams.model_fields)
_MHA_FIELDS = set(AttentionParams.model_fields)


class AttentionBlock(Rewriter):
    name = "attention_block"
    targets = frozenset({"onnxruntime", "generic"})
    Params = AttentionBlockParams

    def rewrite(
        self, match: Match, params: AttentionBlockParams, ctx: RewriteContext
    ) -> Rewrite | str:
        grouped = params.k_repeat_node is not None
        capped = params.softcap_out_node is not None
        tried = []
        unsplit = False  # k or v is no head split: [B, N, L, H] heads as they are
        if params.sink_concat_node is not None:
            tried.append(
                "not MultiHeadAttention: it has no input for attention sinks (a logit per "
                "head in the softmax's denominator)"
            )
        elif not grouped and not capped:
            splits = _head_splits(match, params)
            if isinstance(splits, str):
                unsplit = True  # the heads as they are may still go (below)
                tried.append(f"not MultiHeadAttention: {splits}")
            else:
                mha_params = AttentionParams(**params.model_dump(include=_MHA_FIELDS))
                mha = multi_head_attention(match, mha_params, splits, ctx)
                if not isinstance(mha, str):
                    # k's and v's head splits go with the block (only it reads them): what
                    # a later round matches around the projections sees no reader left
                    mha.absorbed += [n for s in splits[1:] for n in (_reader(s), s)]
                    return mha
                tried.append(f"not MultiHeadAttention: {mha}")
        if params.mask_node is None:
            tried.append("not GroupQueryAttention: the scores have no mask")
        else:
            gqa_params = GQAParams(**params.model_dump(include=_GQA_FIELDS))
            gqa = GroupQueryAttention().rewrite(match, gqa_params, ctx)
            if not isinstance(gqa, str):
                return gqa
            tried.append(f"not GroupQueryAttention: {gqa}")
        if (grouped or unsplit) and not capped and params.sink_concat_node is None:
            mha_params = AttentionParams(**params.model_dump(include=_MHA_FIELDS))
            repeats = _repeats(params) if grouped else {}
            mha = grouped_multi_head_attention(match, mha_params, repeats, ctx)
            if not isinstance(mha, str):
                # why not the op that reads the cache itself: a near miss beside the fusion
                mha.notes += [t for t in tried if t.startswith("not GroupQueryAttention")]
                return mha
            which = "the repeated heads" if grouped else "the heads as they are"
            op = "MultiHeadAttention" if ctx.target.can_emit(MS_DOMAIN) else "ONNX Attention"
            tried.append(f"not {op} of {which}: {mha}")
        if params.mask_node is not None and ctx.target.can_emit(MS_DOMAIN) and narrow_values(match):
            gqa_params = GQAParams(**params.model_dump(include=_GQA_FIELDS))
            padded = GroupQueryAttention(pad_values=True).rewrite(match, gqa_params, ctx)
            if not isinstance(padded, str):
                return padded
            tried.append(
                f"not GroupQueryAttention of values padded to the key's head size: {padded}"
            )
        return "; ".join(tried)

    def cost_effect(self, match: Match, params: AttentionBlockParams) -> RewriteEffect:
        """One kernel for the block; in mode ``cache`` where it reads a KV cache (the
        GroupQueryAttention it emits takes a past key and value), which a profile may
        price apart from the prefill (``attention+softcap+cache``, docs/cost.md)."""
        return RewriteEffect(matched(match), modes=("cache",) if _reads_cache(match) else ())


def _reads_cache(match: Match) -> bool:
    """Whether the key heads are ``Concat(past, new)`` along the sequence: the KV cache
    that GroupQueryAttention's ``kv_side`` takes as its past key."""
    heads = match.value("$k")
    producer = heads.producer() if heads is not None else None
    return (
        producer is not None
        and producer.op_type == "Concat"
        and len(producer.inputs) == 2
        and attribute_value(producer, "axis", 0) in (2, -2)
    )


def _head_splits(match: Match, params: AttentionBlockParams) -> list[ir.Node] | str:
    """The Reshapes of q, k and v into heads, or why k and v are not plain head splits
    of ``[B, L, N * H]`` read by this attention alone (a cache, or heads read
    elsewhere, are GroupQueryAttention's)."""
    splits = [match.node(params.q_reshape_node)]
    readers = {"key": match.node(params.k_transpose_node), "value": match.node(params.context_node)}
    for what, ref in (("key", "$k"), ("value", "$v")):
        heads = match.value(ref)
        split = "no value" if heads is None else head_split(heads, what)
        if isinstance(split, str):
            return split
        transpose, reshape = split
        for value, reader in ((heads, readers[what]), (reshape.outputs[0], transpose)):
            if value.is_graph_output() or any(c is not reader for c in consumers(value)):
                return f"the {what} heads {value.name!r} are also read outside the attention"
        splits.append(reshape)
    return splits


def _reader(reshape: ir.Node) -> ir.Node:
    """The head Transpose that alone reads ``reshape`` (``_head_splits`` proved it)."""
    return consumers(reshape.outputs[0])[0]


def _repeats(params: AttentionBlockParams) -> dict[str, list[str]]:
    """The matched repeat_kv nodes (Unsqueeze, Expand, Reshape) of the key and value."""
    steps = ("unsqueeze", "expand", "repeat")
    return {w: [str(getattr(params, f"{w}_{step}_node")) for step in steps] for w in ("k", "v")}
