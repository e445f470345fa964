"""``group_query_attention``'s params: the pattern nodes the rewriter reads."""

from __future__ import annotations

from autofusion.fusion_core.rewriters._attention_shapes import HeadNodes

__all__ = ["GQAParams"]


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
