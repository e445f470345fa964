"""``group_query_attention``: causal attention whose query heads share key/value heads,
with its KV cache, as one com.microsoft ``GroupQueryAttention`` (onnxruntime target; ONNX
``Attention`` on the generic target, at the end)::

    Q = Transpose(Reshape(q, [B, S, N, H]), [0, 2, 1, 3])              q: [B, S, N * H]
    K = Concat(past_k, Transpose(Reshape(k, [B, S, KV, H]), [0, 2, 1, 3]), axis=2)
    K' = Reshape(Expand(Unsqueeze(K, 2), [B, KV, N / KV, L, H]), [B, N, L, H])  repeat_kv
    P = Softmax(Q @ K'^T * c + M)         (or Q * s_q @ K'^T * s_k, c = s_q * s_k;
                                           or t * tanh(Q @ K'^T * c / t) + M: softcap=t)
    y = Reshape(Transpose(P @ V', [0, 2, 1, 3]), [B, S, N * H])
      = GroupQueryAttention(q, k, v, past_k, past_v, seqlens_k, total_sequence_length,
                            attention_bias=M, num_heads=N, kv_num_heads=KV, scale=c)
    present_k = K,  present_v = V          (GroupQueryAttention's outputs 1 and 2)

(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.GroupQueryAttention).
``L = P + S`` is the key length, ``P`` the past length (0 without a cache: the prefill
exports without one fuse too, with no past inputs). ``q``, ``k`` and ``v`` are read
back through the head splits (``q`` usually a ``RotaryEmbedding``'s output, see
``rotary``), the heads proven from the Reshape targets and the repeat proven to map
query head ``n`` to KV head ``n // (N / KV)`` from the sizes the graph proves. Every
size a decision rests on (the query's and the key's lengths, ``P``, the graph input a
length is read from) is proven from the graph, never read from a label an inference
put on a value, which may name two sizes alike (``_proven``). Two checks, the head
split's batch and sequence and a sliding window's queries and keys, read the labels
where the proof decides neither way (a value's own size: LFM2's hidden states behind its
convolution state; a size capped by a constant: GPT-Neo's sliced causal buffer); sizes
proven different still refuse.

The rotary stays in its own ops, and q, k, v stay split, though the kernel can take
both (``do_rotary`` with ``cos_cache``, ``sin_cache``, ``position_ids``; packed QKV
with key and value empty), as onnxruntime-genai's model builder writes it. Measured
with onnxruntime 1.32's CPU kernel (docs/benchmarks.md, "Rotary and packed QKV inside
GroupQueryAttention"): exact only with past inputs (without them it rotates by
``0 .. S - 1`` and ignores ``position_ids``), with at least ``L`` cache rows (the
per-call cache ``rotary`` builds from the graph's own angles has ``B * S``) and
``r / 2`` a multiple of 8; and where exact, no faster: the kernel's own rotation costs
about what the two RotaryEmbedding ops and the Split it replaces cost.

The mask: GroupQueryAttention takes ``seqlens_k`` (per batch, the index of the last
valid key) and assumes the valid keys are ``[0, seqlens_k]`` at the start of each row:
right padding only. Hugging Face generation pads on the left, and the graph's mask
(built from ``attention_mask``) may hold any pattern, so a ``seqlens_k`` read from the
mask (``ReduceSum(attention_mask) - 1``, what onnxruntime-genai's model builder writes)
would be wrong for every padded batch: it shifts the positions and the cache slots. So
``seqlens_k = L - 1`` for every batch (every cache row is a real row, as it is in the
graph), ``total_sequence_length = L``, and the padding reaches the kernel through
``attention_bias = M``, the graph's own mask (``[B or 1, 1, S, L]``), which also carries
any sliding window the proof below does not reach: nothing about the mask is assumed.
Left, right and inner padding are all exact
(tests/fusion_core/rewriters/test_group_query_attention.py).

What is left is where GroupQueryAttention differs from a plain softmax:

* it is causal when ``causal = 1``, and with a cache its CPU kernel needs that (a batch
  of several new tokens each is refused otherwise, and ``query_seqlens`` = S, which it
  then needs, requires it). So the mask must be proven causal: some term of its
  conjunction is ``Range(0, L) <= Range(P, P + S)`` on the key and query axes
  (``_causal``); without a cache ``causal = 0`` is used when that proof fails;
* a query row that may attend to nothing: the graph's softmax over ``-inf`` gives NaN,
  which the SDPA export's ``Where(IsNaN(P), 0, P)`` turns into 0, while the kernel
  with a finite bias averages something. As for ``attention``, ``-inf`` becomes
  the lowest of the mask's type (float32's, or float16's -65504: the kernel adds the
  bias in float32, so the row stays finite) and the output rows whose mask row is
  empty are multiplied by 0 (``guarded_mask``). A finite mask (``Where(cond, 0,
  lowest)``: dynamo's, eager attention's) gives such a row the average of every key,
  and causal attention the average of the earlier ones only: without a cache it fuses
  with ``causal = 0``; with one (``causal = 1``) those rows are picked (``Where``) from
  each head's mean of the cache's values, ``ReduceMean(present_value)`` over the keys,
  repeated to the query heads, inside ``If(every row attends, Identity(out),
  Where(keep, out, mean))``: a step with no empty row (every decode step) does not read
  the value cache for it (``_empty_rows_guard``, its condition built once per mask).
  A float16 mask's finite lowest (-65504, -1e4) does not
  swamp the scores where onnxruntime's CPU adds it (in float32): such a row is the
  softmax over every key, which the kernel gives the last query exactly, so that row
  keeps the kernel's output and the earlier ones (a prefill's padded positions) take
  the mean (``_bias``).

When the kernel is causal anyway, the graph's ``[B, 1, S, L]`` mask is more than it
needs: a decode step would still build it from two Ranges, the comparison and an Expand
to every query (about 30 small nodes of the export, once a step). So where a ``-inf``
mask is exactly the causal term and terms that are the same for every query
(``[B or 1, 1, 1, L]``: padding; ``_window.query_free_terms``), the bias is those terms
alone, ``Where(t, 0, lowest)`` broadcast over the S queries (the kernel wants S rows),
and the rows to keep come from the running count of ``t``: row ``s`` sees the keys
``j <= P + s``, so it has one iff ``CumSum(t)[P + s] > 0``. Where a term is
``attention_mask[b, j]`` gathered per batch and key (transformers' ``sdpa_mask``
through TorchScript, proven in ``_padding``), it is read from the mask input itself.
With no term besides the causal one there is no bias: every row sees its first key.

A sliding window (Mistral, Gemma-2's local layers, Qwen2's ``use_sliding_window``) is
a term that varies with the query, ``key > P + s - W`` (transformers'
``kv_idx > q_idx - sliding_window``). Where it is proven, with ``W`` a constant, from a
comparison of the same key and query indices in either orientation (``_window``), the
kernel applies it: ``local_window_size = W`` (onnxruntime lets the query at ``p`` see
the keys ``p - W < j <= p``, its own included, since microsoft/onnxruntime#25927, one
key more before it: measured against numpy with the pinned onnxruntime in
tests/fusion_core/rewriters/test_group_query_attention_window.py), the bias is the
query-free terms alone as above, and a row keeps its output iff the padding leaves it a
key inside the window, ``CumSum(t)[P + s] - CumSum(t)[P + s - W] > 0`` (0 before the
first key; with left padding alone the same rows as without the window, with holes
not). A decode step then computes no positions or comparisons for its mask, and the
kernel skips the keys outside the window. A term that varies with the query and is
not proven a window (``W`` read from an input, another orientation) keeps the whole
mask as the bias, exact, and the fusion's near miss (kind ``rewriter``) says that the
window stays in the bias and why.

A mask summed from two masks, ``Where(c1, 0, a) + Where(c2, 0, b)`` (GPT-Neo's causal
buffer filled into the scores beside transformers' 4-D padding mask, once ``one_bias``
has summed them), is no ``Where`` of its own: a row of padding alone is neither NaN nor
the average of every key there, but the average of the keys the causal term allows
(the keys after the query get ``a + b``, ``-inf`` for two lowest floats). Where both
terms are proven causal, one allows every query its own key (the causal term and
windows alone) and ``a + b`` is far below ``b`` (``_summed``), that is what the causal
kernel gives with the whole sum as its bias, exact with no row fixed after it; the sum
is halved where a level may be the lowest float, which onnxruntime's kernel reads as a
row with no key (0). The first term's window becomes ``local_window_size`` only where
``a`` is far below ``b`` too (with ``a = b``, GPT-Neo's, a row whose window is all
padding spreads over the unpadded keys before it, so the window stays in the bias, and
a note says so). Float32 only; on the generic target the sum is refused as before.

On the generic target (opset 23, or ``--upgrade-opset 23``) the same block becomes ONNX
``Attention(q, k, v, attn_mask=M, past_key, past_value)`` with ``q_num_heads = N``,
``kv_num_heads = KV`` and the present outputs
(https://onnx.ai/onnx/operators/onnx__Attention.html): it appends the cache itself and,
not causal, takes the whole mask as it is, so neither the causal proof nor a limit on
the cache applies; the ``-inf`` rows are handled as above.

Value heads narrower than the query's (``Hv < H``: MiMo-V2-Flash), which the kernel does
not take, are padded with zeros to ``H`` and each context head cut back to ``Hv``
(``GroupQueryAttention(pad_values=True)``, exact; without a KV cache only:
``_narrow_values``); ``attention_block`` asks for it where nothing else takes the block.

Every refusal names the step that failed (a near miss of kind ``rewriter``).
The rewriter is in ``_rewriter`` (its params in ``_params``), the inputs are traced in
``_inputs``, the mask the kernel takes is decided in ``_mask`` and the rows with nothing
to attend to fixed after it in ``_empty_rows``; the causal proof is in ``_causal``, the
sliding window's in ``_window``, the padding term's in ``_padding``, the sum of two
masks' in ``_summed``, the bias built in ``_bias``, the lengths in ``_lengths``, the
sizes they rest on proven in ``_proven``.
"""

from __future__ import annotations

from autofusion.fusion_core.rewriters.group_query_attention._inputs import head_split
from autofusion.fusion_core.rewriters.group_query_attention._narrow_values import narrow_values
from autofusion.fusion_core.rewriters.group_query_attention._rewriter import (
    GQAParams,
    GroupQueryAttention,
)

__all__ = ["GQAParams", "GroupQueryAttention", "head_split", "narrow_values"]
