"""The canonical form: value-preserving rewrites that bring equivalent spellings of a
block to the one spelling the patterns match, before each round of matching.

A new way an exporter or a model family writes a known block is a rule here, not one
more copy of every pattern that reads it. Each rule changes no value: it inserts,
moves or merges ops whose composition is the identity on what the graph computes (the
check of every job proves it again on the model as fused); ``scale_to_scores`` alone
rounds differently (a product of two scales once, not each operand), as any fusion
that applies the scale itself does. Rules are idempotent, so
running them before every round (a fusion may expose a spelling) changes nothing twice.

* ``known_scalars`` (``_scalars.py``): a scale or a size the graph computes from sizes
  the shapes fix (``1 / sqrt(q.shape[-1])``) becomes a constant;
* ``einsum_matmul`` (``_einsum.py``): a two-operand Einsum that is one batched dot
  product (Funnel's ``bind,bjnd->bnij`` scores and ``bnij,bjnd->bind`` context) is
  Transposes and a MatMul; written back where no fusion takes it;
* ``position_scale`` (``_position_scale.py``): rotated query heads scaled by one factor
  per position (Ministral-3's ``llama_4_scaling``) are the rotation of the projection so
  scaled;
* ``interleaved_columns`` (``_interleaved_columns.py``): heads whose last axis is read
  in another order (the interleaved rope part of multi-head latent attention, DeepSeek's
  ``view(.., d/2, 2).transpose(-1, -2).reshape`` or ``x[..., 0::2]``, ``x[..., 1::2]``)
  are computed in that order by their projection, its weight (and bias) columns
  permuted, and read as contiguous Slices;
* ``rotary_halves`` (``_rotary_halves.py``): gpt-oss's rotary embedding of two halves,
  ``Concat(x1 * c - x2 * s, x2 * c + x1 * s)``, in the rotate-half spelling;
* ``rotary_sign`` (``_rotary_sign.py``): a rotation with the halves swapped the other
  way, ``x * c + Concat(x2, -x1) * Unsqueeze(t)`` (nanochat), is ``x * c + Concat(-x2,
  x1) * Unsqueeze(-t)``, exactly;
* ``softmax_shift`` (``_softmax_shift.py``): ``Softmax(x - ReduceMax(x))`` (gpt-oss's
  attention sinks) is ``Softmax(x)``;
* ``sink_scale`` (``_sink_scale.py``): a context scaled by ``Sigmoid(ReduceLogSumExp(s)
  - b)`` (Granite-SWA's attention sinks) is the context of ``Slice(Softmax(Concat(s,
  b)), :-1)``, gpt-oss's spelling;
* ``norm_spelling`` (``_norm_spelling.py``, read by ``_norm_reads.py``): an RMS norm
  or LayerNorm in any spelling of its square, means, epsilon (none is 0), inverse root
  (``Div``, ``Reciprocal``, ``Div(1, .)``, ``Pow(u, -0.5)``) and centering
  (``Add(x, Neg(m))``) is written ``Mul(d, Reciprocal(Sqrt(ReduceMean(Pow(d, 2)) +
  eps)))``, ``d = Sub(x, ReduceMean(x))``: one pattern per norm;
* ``gelu_spelling`` (``_gelu_spelling.py``, read by ``_gelu_reads.py``): a GELU, erf
  or tanh form, in any pairing of its product, any form of its argument (BLOOM's ``x *
  (1 + k * x * x)``, ``Pow(x, 3)`` or ``x * x * x``, Div or Mul by the constant) and
  either gate (``1 + T``, ``0.5 + 0.5 * T``) is written in one spelling: one pattern
  per form;
* ``heads_in_batch`` (``_heads_in_batch.py``): a batched MatMul or Softmax between a
  fold of the heads into the batch (``[B * N, S, H]``, bmm: XGLM, BART-era exports) and
  the unfold after it is computed over ``[B, N, S, H]``;
* ``sequence_first_fold`` (``_sequence_first_fold.py``): heads folded into the batch
  straight from a sequence-first ``[S, B, E]`` (F.multi_head_attention_forward's bmm
  path: WavLM) read as a fold of batch-first heads, which ``heads_in_batch`` unfolds;
* ``scale_to_scores`` (``_scales.py``): SDPA's scale split over Q and K^T multiplies
  the scores instead, as in the eager attention;
* ``unit_scale`` (``_scales.py``): scores no scale multiplies are multiplied by 1;
* ``mask_as_bias`` (``_masks.py``): a mask applied in any of the usual ways (a blocked
  condition, the float mask ``(1 - m) * lowest``, masked_fill of the scores) is
  ``Where(allowed, 0, negative)`` added to the scores;
* ``whole_scatter``, ``causal_fill``, ``padding_fill`` and ``identity_mask_expand``
  (``_fill_masks.py``): the
  float causal mask of transformers' older mask converter (``triu`` of the lowest float,
  the padding written in place by a ScatterND) read as ``Where(allowed, 0, lowest)``;
* ``blend_mask`` (``_blend_masks.py``): a mask blended as ``w * b + c * (1 - b)``
  with ``b`` a constant of 0s and 1s (or slices of one: OpenAI GPT's ``bias[:, :, :S,
  :L]``) is the masked_fill ``Where(b, w, c)``, its condition the same slices of the
  constant made boolean;
* ``bounded_fill`` (``_bounded_fills.py``, the bounds in ``_score_bounds.py``): a
  masked_fill of scores by a finite fill they do not absorb (``-1e4``) takes the fill
  -1e30 where the scores are proven at most ``-c - 104`` in magnitude (norms of the
  weights) and only pads of 0 or at least ``2**124`` are added after it: no Softmax row
  changes;
* ``buffer_mask`` (``_buffer_masks.py``): a causal or banded mask sliced out of a
  constant buffer (GPT-Neo's ``bias[:, :, L - S : L, :L]``) computed as ``key <= query``
  (``And key > query - W``) over ``[1, 1, S, L]``;
* ``mask_guard`` (``_mask_guard.py``): a Softmax's output zeroed by the condition
  that masked its input (CPM-Ant's ``Where(c, 0, Softmax(Where(c, -inf, s)))``) is
  SDPA's NaN guard ``Where(IsNaN(P), 0, P)``; a finite fill is written ``-inf`` for it;
* ``subtracted_bias`` (``_subtracted_bias.py``): ``scores - c * x`` (Funnel's mask,
  ``c`` a scalar constant) is ``scores + (-c) * x``, exactly;
* ``mask_clamp`` (``_masks.py``): ``Max(scores + finite mask, lowest)`` (XGLM) is no op;
* ``one_bias`` (``_biases.py``): a chain of biases added to the scores one after the
  other (masks, T5's position bias, ALiBi, Funnel's position and token-type scores) is
  summed first, so the scores take one; exact where all but one are masks the scores are
  proven to be absorbed by, else it rounds as ``scale_to_scores`` and goes back unfused;
* ``repeat_kv`` (``_repeats.py``): KV heads repeated by Tile, Concat or a Gather are
  repeated as transformers' repeat_kv (Unsqueeze, Expand, Reshape);
* ``identity_zero_add``, ``identity_reshape`` and ``identity_slice`` (``_identity.py``):
  ``x + zeros`` (``baddbmm``'s ``beta * 0``: GPT-NeoX-Japanese) where the zeros are
  proven no larger than ``x`` is ``x``; a Reshape or a Slice proven to keep its input's
  shape goes;
* ``copied_dims`` (``_reshape_targets.py``): a Reshape target computed from shapes that
  copies the input's batch and sequence becomes a constant ``[0, 0, ...]``;
* ``flat_head_split`` (``_flat_head_split.py``): heads split straight from ``[B * S,
  C]`` rows (LeViT's BatchNorm'd Linears, dynamo) are split from the rows viewed as
  ``[B, S, C]``, exactly; the view goes again where no fusion takes it;
* ``packed_part``, ``sequence_first_heads``, ``sequence_first_merge``
  (``_sequence_first.py``) and ``kt_by_reshape`` (``_kt_by_reshape.py``):
  nn.MultiheadAttention's sequence-first
  layout (parts of a packed projection, heads split and merged as [L, B * h, d]) made
  batch-first, and dynamo's K^T through a 3-D Reshape made one Transpose;
* ``kt_of_folded_heads`` (``_batched_key_transpose.py``): the same K^T, ``Reshape(
  Transpose(Reshape(k, [B * N, L, H]), [0, 2, 1]), [B, N, H, L])``, where the inferred
  dimensions prove nothing (MiniMax-M3's decode step for any number of tokens, its
  targets read from the key's Shape): ``Transpose(k, [0, 1, 3, 2])`` where both targets
  are proven from the graph (``fusion_core.sizes``) to merge exactly the two leading
  axes and split them back; exact, and one Transpose where no fusion takes it;
* ``kt_of_heads`` (``_key_transpose.py``): K^T written as one Transpose ``Transpose(x,
  p)`` is the swap ``[0, 1, 3, 2]`` of ``Transpose(x, q)``, ``q = p[[0, 1, 3, 2]]``: for
  ``p = [0, 2, 3, 1]`` the key heads ``[0, 2, 1, 3]`` of a head split (a decoder's K^T of
  its cache, dynamo's unoptimized export); for any other ``p`` only where ``Transpose(x,
  q)`` is proven a ``[B, KV, L, H]`` key (``x`` a Transpose, or ScatterNDs into one, that
  ``q`` undoes to the key or its head split; the key's last sizes the query's head size
  and the scores' length): eager attention's ``key.transpose(2, 3)`` merged into dynamo's
  Transpose back of a key written in place (HY-V4, ``[3, 1, 0, 2]``);
* ``packed_heads`` (``_packed.py``): q, k and v picked from one projection viewed as
  ``[B, S, P, N, H]`` (ModernBERT) by Split and Squeeze, Gather or Slice are head splits
  of their own slices of it;
* ``one_kv_head`` (``_unsqueezed.py``): GPTBigCode's ``qkv.unsqueeze(1).split(...)``:
  the Split before the Unsqueeze, the query's Reshape through it, and the one KV head
  that repeat_kv repeats read as a one-head split;
* ``gather_nd_as_slice``, ``slice_before_transpose_of_one`` and ``transposes_composed``
  (``_picks.py``): one head picked out of a permuted projection (dynamo's Falcon) is a
  Slice of the head split;
* ``slice_before_transpose`` and ``heads_by_slice`` (``_slices.py``): the q, k and v of
  one fused projection, sliced per head (GPT-NeoX) or by heads (Falcon), become slices
  of the projection before its head layout;
* ``transpose_after_norm`` and ``transpose_after_rotary`` (``_transposes.py``): a norm
  of each head after the head Transpose (Gemma-3, Persimmon) moves before it, where
  Qwen3 has it, and a fused rotary embedding of transposed heads rotates the 3-D
  projection instead;
* ``scale_after_rotary`` (``_scale_after_rotary.py``): a scalar scale of the heads
  before a fused rotary embedding (ESM's scaled query) multiplies the rotated heads,
  ``R(c x) = c R(x)``, for ``transpose_after_rotary`` and ``scale_to_scores``; it rounds
  differently, as ``scale_to_scores`` does, and goes back where no attention takes it;
* ``transpose_before_rotary`` (``_rotary_heads.py``): a rotary embedding written out
  on ``[B, S, N, H]`` heads before their head Transpose (Gemma-4) rotates the
  transposed heads, as Llama's does;
* ``scatter_parts`` (``_scatter_parts.py``): key heads written slab by slab into an
  empty tensor are the Concat of the slabs: ScatterNDs over index grids (TorchScript's
  ``new_empty`` and ``copy_``: DeepSeek-V2, MiniCPM3), or dynamo's ``slice_scatter`` on
  the buffer transposed so its last axis leads (``Transpose(ScatterND(.., Unsqueeze(
  Range(lo, hi)), Transpose(part, t)), t^-1)``: DeepSeek-V3, HY-V4), where the slabs tile
  the last axis;
* ``concat_heads`` (``_concat_heads.py``): heads an attention reads as a last-axis
  Concat, Split or Slice of ``[B, N, S, *]`` parts (multi-head latent attention's
  ``cat(q_nope, rot(q_pe))``, its shared one-head ``k_pe`` expanded, its ``k_nope`` and
  ``v`` split from one projection) are the head split of the parts laid out as
  ``[B, S, N, *]``;
* ``value_scale`` (``_value_scale.py``): values scaled by a constant (one number, one
  per head or per channel) after their head split (MiMo-V2-Flash's ``v * v_scale``) are
  the head split of the projection so scaled, exactly;
* ``window_mask`` (``_window_masks.py``): masks added on a window view of the scores
  (Swin-V2's shifted windows, ``Reshape(Reshape(s, [B, W, N, S, L]) + m, [B * W, N, S,
  L])``) are added to the scores, each tiled over the images, exactly;
* ``cosine_heads`` (``_cosine_heads.py``): an L2 normalization of each row of transposed
  heads (Swin-V2's ``F.normalize(q, dim=-1)``: ReduceL2, a clamp, an Expand to the heads'
  own shape, Div) is computed before the Transpose, exactly, where ``head_split`` finds it;
* ``head_scale`` (``_head_scale.py``): scores scaled by a constant per head (Swin-V2's
  ``exp(min(logit_scale, log 100))``) scale the query heads instead; it rounds
  differently, as ``scale_to_scores`` does, and goes back where no attention takes it;
* ``head_split`` (``_head_split.py``): ops between a head split and the head Transpose
  (a per-head q/k norm, a slice of a fused projection) are moved out of the way by a
  merge/split Reshape pair;
* ``one_context`` (``_contexts.py``): contexts ``P @ V_i`` of one softmax joined on the
  last axis (differential attention's two halves of the value) are the context of the
  joined values, joined before their repeat_kv;
* ``context_read_after_transpose`` (``_head_turns.py``): elementwise ops with a
  constant (a per-head gate ``[N, 1, Hv]``) between a context and its head Transpose run
  after the Transpose on the constant transposed alike, exactly;
* ``context_heads`` (``_contexts.py``): a context read per head (any op after the head
  Transpose) is read through a merge/split Reshape pair of its
  heads, which the attention pattern's head merge binds.

The rules read shape values and decide sizes with ``fusion_core.sizes`` (``entries``,
``known_dims``, ``scalar``, ``axes_of``; ``proven_equal``/``proven_same``), as the
rewriters do: the graph's proof first, the labels only where it cannot tell.

What the rules inserted and no fusion consumed is taken out after the last round
(``undo_unused``), so a model where nothing fused comes out as it went in.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection
from typing import Protocol

import onnx_ir as ir

from autofusion.fusion_core.canonical._batched_key_transpose import kt_of_folded_heads
from autofusion.fusion_core.canonical._biases import biases_summed, undo_biases
from autofusion.fusion_core.canonical._blend_masks import blend_masks, undo_blend_masks
from autofusion.fusion_core.canonical._blocked import blocked_projections
from autofusion.fusion_core.canonical._bounded_fills import bounded_fills, undo_bounded_fills
from autofusion.fusion_core.canonical._buffer_masks import buffer_masks, undo_buffer_masks
from autofusion.fusion_core.canonical._concat_heads import concat_heads
from autofusion.fusion_core.canonical._contexts import (
    context_heads,
    one_context,
    undo_context_heads,
    undo_one_context,
)
from autofusion.fusion_core.canonical._cosine_heads import cosine_heads
from autofusion.fusion_core.canonical._einsum import einsums_as_matmuls, undo_einsums
from autofusion.fusion_core.canonical._fill_masks import (
    causal_fills,
    identity_mask_expands,
    padding_fills,
    whole_scatters,
)
from autofusion.fusion_core.canonical._flat_head_split import (
    flat_head_splits,
    undo_flat_head_splits,
)
from autofusion.fusion_core.canonical._gelu_spelling import gelu_spellings, undo_gelu_spellings
from autofusion.fusion_core.canonical._head_scale import head_scales, undo_head_scales
from autofusion.fusion_core.canonical._head_split import MERGE, SPLIT, split_heads_last
from autofusion.fusion_core.canonical._head_turns import (
    context_reads_after_transpose,
    head_reads_before_transpose,
)
from autofusion.fusion_core.canonical._heads_in_batch import heads_unfolded
from autofusion.fusion_core.canonical._identity import (
    drop_identity_reshapes,
    drop_identity_slices,
    drop_zero_adds,
)
from autofusion.fusion_core.canonical._interleaved_columns import interleaved_columns
from autofusion.fusion_core.canonical._interleaved_undo import undo_interleaved_columns
from autofusion.fusion_core.canonical._key_transpose import kt_of_heads, undo_kt_splits
from autofusion.fusion_core.canonical._kt_by_reshape import kt_by_reshapes
from autofusion.fusion_core.canonical._mask_guard import masks_as_guards, undo_mask_guards
from autofusion.fusion_core.canonical._masks import clamps_dropped, masks_as_bias, undo_fills
from autofusion.fusion_core.canonical._norm_spelling import norm_spellings, undo_norm_spellings
from autofusion.fusion_core.canonical._packed import packed_heads
from autofusion.fusion_core.canonical._per_head_norms import per_head_norms
from autofusion.fusion_core.canonical._picks import (
    compose_transposes,
    gather_nd_as_slices,
    slices_before_transposes,
)
from autofusion.fusion_core.canonical._position_scale import position_scales, undo_position_scales
from autofusion.fusion_core.canonical._repeats import repeats_as_expand, undo_gathers
from autofusion.fusion_core.canonical._reshape_targets import copy_reshape_dims
from autofusion.fusion_core.canonical._rotary_halves import rotary_halves, undo_rotary_halves
from autofusion.fusion_core.canonical._rotary_heads import transposes_before_rotaries
from autofusion.fusion_core.canonical._rotary_sign import rotary_signs
from autofusion.fusion_core.canonical._scalars import fold_known_scalars
from autofusion.fusion_core.canonical._scale_after_rotary import (
    scale_after_rotaries,
    undo_scale_after_rotaries,
)
from autofusion.fusion_core.canonical._scales import (
    scales_to_scores,
    undo_scales,
    undo_unit_scales,
    unit_scales,
)
from autofusion.fusion_core.canonical._scatter_parts import scatter_parts
from autofusion.fusion_core.canonical._sequence_first import (
    packed_parts_as_slices,
    sequence_first_heads,
    sequence_first_merges,
)
from autofusion.fusion_core.canonical._sequence_first_fold import sequence_first_folds
from autofusion.fusion_core.canonical._sink_scale import sink_scales, undo_sink_scales
from autofusion.fusion_core.canonical._slices import heads_by_slice, slice_before_transpose
from autofusion.fusion_core.canonical._softmax_shift import softmax_shifts_dropped
from autofusion.fusion_core.canonical._subtracted_bias import subtracted_biases, undo_subtracted
from autofusion.fusion_core.canonical._transposes import (
    transpose_after_norms,
    transpose_after_rotaries,
)
from autofusion.fusion_core.canonical._unsqueezed import one_kv_heads, undo_one_head_splits
from autofusion.fusion_core.canonical._value_scale import undo_value_scales, value_scales
from autofusion.fusion_core.canonical._window_masks import window_masks

__all__ = [
    "MARK",
    "RULES",
    "RuleGuard",
    "canonical_form",
    "describe",
    "undo_unused",
]

MARK = "autofusion.canonical"  # metadata_props key on every node a rule inserts
# In this order: the slice and norm rules make head splits that ``head_split`` then
# completes.
RULES: dict[str, Callable[[ir.Graph, Callable[[str], str], str], int]] = {
    "known_scalars": fold_known_scalars,
    "einsum_matmul": einsums_as_matmuls,  # the MatMuls every attention rule reads
    "position_scale": position_scales,
    "interleaved_columns": interleaved_columns,  # makes the halves rotary_halves reads
    "rotary_halves": rotary_halves,  # before slice_before_transpose reads the halves
    "rotary_sign": rotary_signs,
    "softmax_shift": softmax_shifts_dropped,
    "sink_scale": sink_scales,
    "norm_spelling": norm_spellings,
    "gelu_spelling": gelu_spellings,
    "sequence_first_fold": sequence_first_folds,  # the bmm folds heads_in_batch then reads
    "heads_in_batch": heads_unfolded,
    "whole_scatter": whole_scatters,
    "causal_fill": causal_fills,
    "padding_fill": padding_fills,
    "identity_mask_expand": identity_mask_expands,
    "blend_mask": blend_masks,  # a masked_fill of a buffer's slices, which buffer_mask reads
    "buffer_mask": buffer_masks,  # a condition mask_as_bias then reads as the causal term
    "bounded_fill": bounded_fills,  # a fill of -1e30 that mask_as_bias then takes
    "mask_guard": masks_as_guards,  # reads the fill's condition before mask_as_bias rewrites it
    "subtracted_bias": subtracted_biases,  # Funnel's s - c * m: the added bias the rest read
    "mask_as_bias": masks_as_bias,
    "mask_clamp": clamps_dropped,
    "scale_to_scores": scales_to_scores,
    "unit_scale": unit_scales,
    "one_bias": biases_summed,
    "repeat_kv": repeats_as_expand,
    # after blend_mask, which reads w * b + c * (1 - b) whole where 1 - b is zeros
    "identity_zero_add": drop_zero_adds,
    "identity_reshape": drop_identity_reshapes,
    "identity_slice": drop_identity_slices,
    "copied_dims": copy_reshape_dims,
    "flat_head_split": flat_head_splits,  # heads of [B * S, C] rows: the rows as [B, S, C]
    "packed_part": packed_parts_as_slices,
    "packed_heads": packed_heads,
    "blocked_projection": blocked_projections,
    "one_kv_head": one_kv_heads,
    "sequence_first_heads": sequence_first_heads,
    "sequence_first_merge": sequence_first_merges,
    "kt_by_reshape": kt_by_reshapes,
    "kt_of_folded_heads": kt_of_folded_heads,  # what kt_by_reshape's inferred dims do not prove
    "kt_of_heads": kt_of_heads,
    "slice_before_transpose": slice_before_transpose,
    "gather_nd_as_slice": gather_nd_as_slices,
    "slice_before_transpose_of_one": slices_before_transposes,
    "transposes_composed": compose_transposes,
    "heads_by_slice": heads_by_slice,
    "per_head_norm": per_head_norms,
    "window_mask": window_masks,  # the scores reach their Softmax as head_scale reads them
    "cosine_heads": cosine_heads,  # the L2 norm of q/k heads, where head_split finds it
    "head_scale": head_scales,  # after cosine_heads: the query's head Transpose in sight
    "transpose_after_norm": transpose_after_norms,
    "transpose_before_rotary": transposes_before_rotaries,
    "scale_after_rotary": scale_after_rotaries,  # leaves the head Transpose to the rotary
    "transpose_after_rotary": transpose_after_rotaries,
    "head_read_before_transpose": head_reads_before_transpose,
    "scatter_parts": scatter_parts,
    "concat_heads": concat_heads,
    "value_scale": value_scales,  # before head_split would split around a scale of [B, S, N, H]
    "head_split": split_heads_last,
    "one_context": one_context,
    "context_read_after_transpose": context_reads_after_transpose,
    "context_heads": context_heads,
}
_WORDS = {
    "known_scalars": "values computed from known sizes made constants",
    "einsum_matmul": "two-operand Einsums of one dot product made Transposes and a MatMul",
    "identity_zero_add": "Adds of zeros that keep the other operand's shape removed",
    "norm_spelling": "parts of norm blocks written as Pow(d, 2), ReduceMean, + eps, * 1 / Sqrt",
    "gelu_spelling": "GELU blocks written as 0.5 x (1 + erf(x / sqrt(2))) or its tanh form",
    "position_scale": "rotated heads scaled per position made rotations of the scaled projection",
    "interleaved_columns": "heads read in another order computed so by their projection",
    "rotary_halves": "rotary embeddings of two halves written with rotate_half",
    "rotary_sign": "rotations by minus the angle written with rotate_half and a negated sine",
    "softmax_shift": "Softmaxes of x - ReduceMax(x) made Softmax(x)",
    "sink_scale": "contexts scaled by Sigmoid(logsumexp - sink) made Softmaxes with a sink column",
    "scale_to_scores": "attention scales split over Q and K^T moved onto the scores",
    "heads_in_batch": "attention over heads folded into the batch computed over [B, N, S, H]",
    "sequence_first_fold": "heads folded into the batch from [S, B, E] folded from [B, N, S, H]",
    "mask_clamp": "clamps of finitely masked scores at the lowest float removed",
    "whole_scatter": "ScatterNDs that write their whole data once replaced by their updates",
    "causal_fill": "float causal masks (Trilu of the lowest float times key > query) made Wheres",
    "padding_fill": "padding written into a float mask (mask + m == 0) made a condition of it",
    "identity_mask_expand": "Expands of a mask to its own shape removed",
    "buffer_mask": "causal masks sliced from a constant buffer computed from key and query",
    "blend_mask": "masks blended as w * b + c * (1 - b) of a 0/1 constant made masked_fills",
    "bounded_fill": "masked_fills of scores proven small by a fill they do not absorb made -1e30",
    "unit_scale": "unscaled attention scores multiplied by 1",
    "mask_guard": "probabilities zeroed by their own mask's condition made NaN guards",
    "mask_as_bias": "attention masks written as Where(allowed, 0, lowest) added to the scores",
    "subtracted_bias": "biases c * x subtracted from scores added as (-c) * x",
    "one_bias": "chains of biases added to the scores one after the other summed first",
    "repeat_kv": "repeated key/value heads written as Unsqueeze, Expand, Reshape",
    "identity_reshape": "Reshapes to their input's own shape removed",
    "identity_slice": "Slices that keep their input's whole shape removed",
    "copied_dims": "Reshape targets that copy their input's dimensions made constants",
    "flat_head_split": "heads split from [B * S, C] rows split from the rows as [B, S, C]",
    "packed_part": "parts picked from a packed projection made Slices",
    "packed_heads": "parts picked from a [.., P, N, H] view of one projection made head splits",
    "blocked_projection": "parts cut from a projection in model-parallel blocks made projections",
    "one_kv_head": "a split after an Unsqueeze and its repeated KV head made head splits",
    "sequence_first_heads": "sequence-first head splits made batch-first",
    "sequence_first_merge": "sequence-first head merges made batch-first",
    "kt_by_reshape": "K^T written Reshape, Transpose, Reshape made one Transpose",
    "kt_of_folded_heads": "K^T over heads folded into the batch, proven so, made one Transpose",
    "kt_of_heads": "K^T written as one Transpose made the swap of the key heads",
    "gather_nd_as_slice": "GatherNDs of one index made Slices",
    "slice_before_transpose_of_one": "Slices moved before the Transpose they read",
    "transposes_composed": "Transposes of Transposes made one",
    "slice_before_transpose": "slices of a fused projection moved before the head Transpose",
    "heads_by_slice": "slices of heads made head splits of their own",
    "per_head_norm": "a LayerNorm of each head with its own weights made one LayerNorm of all",
    "window_mask": "masks added on a window view of the scores added to the scores, tiled",
    "cosine_heads": "L2 normalizations of transposed heads computed before the Transpose",
    "head_scale": "scores scaled by a constant per head made scales of the query heads",
    "transpose_after_norm": "head Transposes moved after the norm of each head",
    "transpose_before_rotary": "head Transposes after a written-out rotary moved before it",
    "scale_after_rotary": "scalar scales before a rotary embedding moved after it",
    "transpose_after_rotary": "head Transposes moved after a rotary embedding of the heads",
    "scatter_parts": "heads written slab by slab by ScatterNDs made a Concat of the slabs",
    "concat_heads": "heads formed by a Concat, Split or Slice of parts made head splits",
    "value_scale": "constant scales of the values moved before their head split",
    "head_split": "head splits moved after their per-head ops",
    "one_context": "contexts of one softmax joined on the last axis made one context",
    "context_read_after_transpose": "elementwise ops on contexts moved after their head Transpose",
    "head_read_before_transpose": "elementwise ops on q or k heads moved before their Transpose",
    "context_heads": "contexts read per head read through a merge and split of their heads",
}


_PASSES = 4  # rules open the way for earlier ones (a clamp gone lets scores read as such)


class RuleGuard(Protocol):
    """What watches the rules (``fusion_core.pipeline.transaction.StepGuard``): told of
    each rule that changed the graph, and of each that raised (it returns what to raise)."""

    def changed(self, name: str) -> None: ...

    def raised(self, name: str, exc: Exception) -> Exception: ...


def canonical_form(
    graph: ir.Graph,
    fresh_name: Callable[[str], str],
    *,
    disabled: Collection[str] = (),
    guard: RuleGuard | None = None,
) -> Counter[str]:
    """Apply every rule to ``graph`` (not its subgraphs) until none applies (at most a
    few passes: the rules are idempotent); how often each applied. ``disabled`` rules do
    not run; ``guard`` checks each rule's changes as they are made."""
    done: Counter[str] = Counter()
    for _ in range(_PASSES):
        changed = False
        for name, rule in RULES.items():
            if name in disabled:
                continue
            try:
                count = rule(graph, fresh_name, MARK)
            except Exception as exc:  # a bug of the rule: the guard says what to do
                if guard is None:
                    raise
                raise guard.raised(name, exc) from exc
            if count:
                done[name] += count
                changed = True
                if guard is not None:
                    guard.changed(name)
        if not changed:
            break
    return done


def undo_unused(graph: ir.Graph) -> Counter[str]:
    """Take out what the rules inserted and no fusion took: each merge/split pair that
    still reads as a pair (the split's readers read the merge's input again), each
    scale on scores still there (``undo_scales``, ``undo_unit_scales``), each repeat
    that was a Gather (``undo_gathers``), each masked_fill of the scores that was made
    an added bias (``undo_fills``), each K^T split in two (``undo_kt_splits``) and each
    scale of the values moved before a head split still there (``undo_value_scales``).
    Returns how many, per rule."""
    undone = 0
    for merge in [n for n in graph if n.metadata_props.get(MARK) == MERGE]:
        merged = merge.outputs[0]
        readers = [use.node for use in merged.uses()]
        if merged.is_graph_output() or not readers:
            continue
        if not all(r.metadata_props.get(MARK) == SPLIT for r in readers):
            continue  # a fusion reads the merged value: the pair is what it fused
        if any(r.outputs[0].is_graph_output() for r in readers):
            continue
        for split in readers:
            split.outputs[0].replace_all_uses_with(merge.inputs[0])
            graph.remove(split, safe=True)
        graph.remove(merge, safe=True)
        undone += 1
    return Counter(
        {
            "head_split": undone,
            "scale_to_scores": undo_scales(graph, MARK),
            "unit_scale": undo_unit_scales(graph, MARK),
            "repeat_kv": undo_gathers(graph, MARK),
            "mask_as_bias": undo_fills(graph, MARK),
            "subtracted_bias": undo_subtracted(graph, MARK),
            "bounded_fill": undo_bounded_fills(graph, MARK),  # reads the masked_fill put back
            "buffer_mask": undo_buffer_masks(graph, MARK),  # reads the masked_fill put back
            "blend_mask": undo_blend_masks(graph, MARK),  # reads the buffer's slices put back
            "mask_guard": undo_mask_guards(graph, MARK),
            "kt_of_heads": undo_kt_splits(graph, MARK),
            "one_kv_head": undo_one_head_splits(graph, MARK),
            "norm_spelling": undo_norm_spellings(graph, MARK),
            "rotary_halves": undo_rotary_halves(graph, MARK),
            "gelu_spelling": undo_gelu_spellings(graph, MARK),
            "context_heads": undo_context_heads(graph, MARK),
            "sink_scale": undo_sink_scales(graph, MARK),
            "position_scale": undo_position_scales(graph, MARK),
            "one_context": undo_one_context(graph, MARK),
            "interleaved_columns": undo_interleaved_columns(graph),  # after rotary_halves
            "value_scale": undo_value_scales(graph, MARK),
            "einsum_matmul": undo_einsums(graph, MARK),  # the MatMuls no fusion took
            "flat_head_split": undo_flat_head_splits(graph, MARK),  # after the pairs' undo
            # after undo_scales, which writes the scale back on the query
            "scale_after_rotary": undo_scale_after_rotaries(graph, MARK),
            "head_scale": undo_head_scales(graph, MARK),  # after the pairs' and unit_scale's
            # last: a chain that rounds, as the graph wrote it (the other undos never read one)
            "one_bias": undo_biases(graph, MARK),
        }
    )


def describe(counts: Counter[str]) -> list[str]:
    """What the rules left for the fusions, in the report's words (its pre-passes)."""
    return [
        f"canonical form: {count} {_WORDS[name]}" for name, count in sorted(counts.items()) if count
    ]
