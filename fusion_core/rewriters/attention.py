"""``attention``: the scaled-dot-product core of multi-head attention as one
com.microsoft ``MultiHeadAttention`` on onnxruntime, or ONNX ``Attention`` (opset 23,
same q/k/v/mask/scale, ``q_num_heads = kv_num_heads = N``) on the generic target when
the model's opset allows; below it the block is refused with that reason and the
generic target folds the scale instead (``fold_scale``)::

    Q = Transpose(Reshape(q, [B, S, N, H]), perm=[0, 2, 1, 3])        q: [B, S, N * H]
    K = Transpose(Reshape(k, [B, L, N, H]), perm=[0, 2, 3, 1])        K^T directly
    V = Transpose(Reshape(v, [B, L, N, H]), perm=[0, 2, 1, 3])
    P = Softmax(MatMul(Q, K) * c + M, axis=-1)       (or MatMul(Q, K) / c, c -> 1 / c)
    y = Reshape(Transpose(MatMul(P, V), perm=[0, 2, 1, 3]), [B, S, N * H])
      = MultiHeadAttention(q, k, v, attention_bias=M, num_heads=N, scale=c)

(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.MultiHeadAttention).
Its default scale is ``1 / sqrt(H)``; the rewriter always passes the graph's constant,
so a model whose scale differs from the default fuses too.

``N`` and ``H`` come from the graph, never from the user: the last two entries of the
head-split Reshape's target (a constant, or a ``Concat`` whose last two parts are
constants, as both exporters write it), a ``-1`` among them resolved with the hidden
size (the last dimension of ``q``, which must be known). The pattern language cannot
say this (it compares whole constants, not entries of a Concat, and cannot relate them
to another value's dimension), so this module checks it, and that each Reshape keeps
the batch and sequence dimensions (``B`` and ``S`` or ``L``): its target entry is 0
(without ``allowzero``) or the input's known dimension, or the known output dimension
equals the input's. Without that proof (TorchScript exports leave the shapes unknown)
the match is refused with the reason, since a Reshape to ``[B * S, 1, N, H]`` would
compute another attention.

The additive mask ``M`` becomes ``attention_bias`` (input 5). onnxruntime 1.32's CPU
kernel takes it only as rank 4 ``[B or 1, N or 1, S, L]`` and rejects a
``[B, 1, 1, L]`` padding mask ("Input 'attention_bias' dimension 2 should be same as
sequence_length"), so the mask's last two dimensions must be known equal to those of
the scores.

The SDPA form (``attention_mha_sdpa.yaml``, PyTorch's ``scaled_dot_product_attention``
exported by dynamo) differs in three places, each named by a parameter:

* the scale is split into ``Mul(Q, s_q)`` and ``Mul(K^T, s_k)`` before the MatMul
  (``q_scale_node``, ``k_scale_node`` in place of ``scale_node``): ``scale = s_q * s_k``;
* ``K^T`` is ``Reshape(Transpose(Reshape(K, [B * N, L, H]), [0, 2, 1]), [B, N, H, L])``
  with ``K`` transposed by ``[0, 2, 1, 3]`` (``k_flat_node``, ``k_unflat_node``); the
  rewriter proves it swaps the last two axes from the known (possibly symbolic) shapes:
  the flat Reshape gives rank 3 ending in ``[L, H]`` of ``K`` and the other gives
  ``[B, N, H, L]``, so the first merges and the second splits the leading axes;
* ``Softmax`` is followed by ``Where(IsNaN(P), 0, P)`` (``nan_guard_node``, the Where),
  which maps a fully masked row (all ``-inf``, softmax NaN) to zeros. MultiHeadAttention
  has no such guard: with ``-inf`` in ``attention_bias`` such a row is not zeros. So the
  guard is dropped only when the mask is ``Where(cond, a, b)`` of finite constants (dynamo
  writes ``Where(mask, 0, -3.4e38)``): then no score is ``-inf``, a fully masked row gets
  a uniform softmax in both graphs, and the guard never fires. A mask that may hold
  ``-inf`` (TorchScript's ``Where(mask, 0, -inf)``, or a graph input) is refused.
"""

from __future__ import annotations

import onnx_ir as ir

from fusion_core.patterns import Match
from fusion_core.rewriters._attention_mask import attention_bias, guarded_mask
from fusion_core.rewriters._attention_shapes import (
    heads_of,
    identity_reshape,
    merges_heads,
    reshapes_same_data,
    swaps_last_axes,
)
from fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter, scale_factor
from fusion_core.targets import MS_DOMAIN

__all__ = ["FuseAttention"]

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
    context_reshape_node: str | None = None  # TorchScript SDPA: Reshape of P @ V to its shape
    output_node: str = "out_reshape"  # the Reshape back to [B, S, N * H]


class FuseAttention(Rewriter):
    name = "attention"
    targets = frozenset({"onnxruntime", "generic"})
    Params = AttentionParams

    def rewrite(self, match: Match, params: AttentionParams, ctx: RewriteContext) -> Rewrite | str:
        contrib = ctx.target.can_emit(MS_DOMAIN)
        if not contrib and ctx.opset < ATTENTION_OPSET:
            return (
                f"ONNX Attention needs opset {ATTENTION_OPSET} (the model has {ctx.opset}); "
                "the generic target folds the attention scale into the projection instead"
            )
        splits = [
            match.node(params.q_reshape_node),
            match.node(params.k_reshape_node),
            match.node(params.v_reshape_node),
        ]
        heads = heads_of(splits)
        if isinstance(heads, str):
            return heads
        output = match.node(params.output_node)
        # MultiHeadAttention's [B, S, N * H] is out_t's [B, S, N, H] with the heads merged,
        # so any Reshape of out_t is the same Reshape of it, unless it copies a dimension
        # from past the second (a 0 entry without allowzero)
        reshape_after = merges_heads(output, splits[0].inputs[0], heads) is not None
        if reshape_after:
            failure = reshapes_same_data(output)
            if failure is not None:
                return failure
        if params.context_reshape_node is not None:
            failure = identity_reshape(match.node(params.context_reshape_node))
            if failure is not None:
                return failure
        scale = 1.0
        scale_nodes = [params.scale_node, params.q_scale_node, params.k_scale_node]
        for name in scale_nodes:
            if name is None:
                continue
            # input 1 after the commutative swap: Mul(c, scores) is written either way
            factor = scale_factor(match.node(name), match.input(name, 1))
            if isinstance(factor, str):
                return factor
            scale *= factor
        if params.k_flat_node is not None and params.k_unflat_node is not None:
            failure = swaps_last_axes(
                match.node(params.k_flat_node), match.node(params.k_unflat_node)
            )
            if failure is not None:
                return failure
        inputs: list[ir.Value | None] = [s.inputs[0] for s in splits]
        nodes: list[ir.Node] = []
        keep_rows = None
        if params.mask_node is not None:
            scores = match.node(params.scale_node or params.qk_node)
            mask = attention_bias(match.node(params.mask_node), scores)
            if isinstance(mask, str):
                return mask
            if params.nan_guard_node is not None:
                guarded = guarded_mask(mask, match.node(params.nan_guard_node), ctx)
                if isinstance(guarded, str):
                    return guarded
                mask, keep_rows, mask_nodes = guarded
                nodes += mask_nodes
            inputs += [None, None, mask]
        nodes.append(_attention_node(contrib, inputs, heads[0], scale, ctx))
        q = splits[0].inputs[0]
        nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = q.type, q.shape
        if keep_rows is not None:
            nodes.append(ir.Node("", "Mul", [nodes[-1].outputs[0], keep_rows]))
            nodes[-1].outputs[0].type, nodes[-1].outputs[0].shape = q.type, q.shape
        if reshape_after:
            nodes.append(
                ir.Node(
                    "",
                    "Reshape",
                    [nodes[-1].outputs[0], output.inputs[1]],
                    output.attributes.values(),
                )
            )
        old = output.outputs[0]
        new = nodes[-1].outputs[0]
        new.type, new.shape = old.type, old.shape
        return Rewrite(nodes, [(old, new)])


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
