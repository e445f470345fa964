"""``attention``: the scaled-dot-product core of multi-head attention as one
com.microsoft ``MultiHeadAttention`` on onnxruntime, or ONNX ``Attention`` (opset 23,
same q/k/v/mask/scale, ``q_num_heads = kv_num_heads = N``) on the generic target when
the model's opset allows; below it the block is refused with that reason and the
generic target folds the scale instead (``fold_scale``)::

    Q = Transpose(Reshape(q, [B, S, N, H]), perm=[0, 2, 1, 3])        q: [B, S, N * H]
    K = Transpose(Transpose(Reshape(k, [B, L, N, H]), [0, 2, 1, 3]), [0, 1, 3, 2])
                                  (K^T: the canonical form writes [0, 2, 3, 1] so)
    V = Transpose(Reshape(v, [B, L, N, H]), perm=[0, 2, 1, 3])
    P = Softmax(MatMul(Q, K) * c + M, axis=-1)       (or MatMul(Q, K) / c, c -> 1 / c)
    y = Reshape(Transpose(MatMul(P, V), perm=[0, 2, 1, 3]), [B, S, N * H])
      = MultiHeadAttention(q, k, v, attention_bias=M, num_heads=N, scale=c)

(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.MultiHeadAttention).
Its default scale is ``1 / sqrt(H)``; the rewriter always passes the graph's constant,
so a model whose scale differs from the default fuses too. ``V``'s head size may differ
from that of ``Q`` and ``K`` (multi-head latent attention: ``Reshape(v, [B, L, N, Hv])``,
the output ``[B, S, N * Hv]``), as MultiHeadAttention (its ``v_hidden_size``) and ONNX
Attention both take; its heads must be ``N``.

``N`` and ``H`` come from the graph, never from the user: the last two entries of the
head-split Reshape's target (a constant, or a ``Concat`` whose last two parts are
constants, as both exporters write it), a ``-1`` among them resolved with the hidden
size (the last dimension of ``q``, proven from the graph where it can be). The pattern
language cannot say this (it compares whole constants, not entries of a Concat, and
cannot relate them to another value's dimension), so this module checks it, and that
each Reshape keeps the batch and sequence dimensions (``B`` and ``S`` or ``L``), and that
the key and value have the query's batch (the graph's MatMuls broadcast a batch of 1,
the op does not). Each is decided on the sizes ``FusedSizeProof`` proves
(``rewriters/_fused_sizes.py``), not on the labels an inference wrote, which may call
``[S, B]`` heads ``[batch, seq]``: proven different refuses; where the proof cannot tell,
the labels decide (a target entry 0 without ``allowzero``, the input's known dimension,
or a known output dimension equal to the input's). Without either (TorchScript exports
leave the shapes unknown) the match is refused with the reason, since a Reshape to
``[B * S, 1, N, H]`` would compute another attention.

The additive mask ``M`` becomes ``attention_bias`` (input 5). onnxruntime 1.32's CPU
kernel takes it only as rank 4 ``[B or 1, N or 1, S, L]`` and rejects a
``[B, 1, 1, L]`` padding mask ("Input 'attention_bias' dimension 2 should be same as
sequence_length"), so the mask's last two dimensions must be known equal to those of
the scores.

The SDPA form (PyTorch's ``scaled_dot_product_attention`` exported by dynamo; the
``attention`` pattern's ``nan_guard`` group) differs in three places, each named by a
parameter:

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
  a uniform softmax in both graphs, and the guard never fires. TorchScript's
  ``Where(mask, 0, -inf)`` goes in with the lowest float for ``-inf`` and the rows with no
  key zeroed after the op (``_attention_mask``); a mask ``bias + Where(cond, k, -inf)``
  whose bias is proven free of ``-inf`` (CPM-Ant's) goes in as ``Where(cond, bias + k,
  lowest)`` with the same rows zeroed. A mask that may hold ``-inf`` otherwise (a graph
  input) is refused.

Grouped key/value heads (repeat_kv) that GroupQueryAttention cannot take become
MultiHeadAttention over the repeated heads (``_grouped``: ``attention_block`` tries it
after GroupQueryAttention).

The rewriter is in ``_rewriter``; the proofs it needs from the shapes (head split and
merge, K^T) in ``fusion_core/rewriters/_attention_shapes.py``, and the mask and the SDPA
NaN guard in ``_attention_mask.py`` (``group_query_attention`` shares both).
"""

from __future__ import annotations

from autofusion.fusion_core.rewriters.attention._grouped import grouped_multi_head_attention
from autofusion.fusion_core.rewriters.attention._rewriter import (
    AttentionParams,
    FuseAttention,
    multi_head_attention,
)

__all__ = [
    "AttentionParams",
    "FuseAttention",
    "grouped_multi_head_attention",
    "multi_head_attention",
]
