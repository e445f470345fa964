"""``sequence_first_fold`` with ``heads_in_batch``: WavLM's attention as
F.multi_head_attention_forward(need_weights=True) writes it (``tests/fusion_core/
wavlm_text.py``), heads folded into the batch straight from ``[S, B, E]``, is read per
head and fuses into one MultiHeadAttention, its gated position bias the attention bias.

Tolerances: the canonical form only moves elements (rtol = atol = 1e-6); the fused
block runs onnxruntime's attention kernel, which sums in another order (rtol = atol =
1e-5 in float32).
"""

from __future__ import annotations

import numpy as np
import pytest

from autofusion.fusion_core.testing import (
    canonical_twice,
    fuse_quiet,
    optimize_quiet,
    run_both,
)
from tests.fusion_core.decoder_text import graph_model
from tests.fusion_core.wavlm_text import FOLD_ATTENTION, Spelling, block, feeds

MOVED = dict(rtol=1e-6, atol=1e-6)
FUSED = dict(rtol=1e-5, atol=1e-5)
TWO = np.array(2.0, np.float32)
WAVLM = Spelling(seq=6, heads=2, size=4, scale_on_q=True, gated=True, tile=True)


@pytest.mark.parametrize("batch", [1, 3])
def test_wavlms_folded_attention_fuses_into_one_attention(batch) -> None:
    model = block(WAVLM)
    fused = fuse_quiet(model)
    assert fused.result.counts.get("attention") == 1, fused.misses_about("attention")
    assert fused.ops_among(("MultiHeadAttention", "Softmax")) == ["MultiHeadAttention"]
    run_both(model, fused.model, feeds=feeds(WAVLM, batch), **FUSED)


def test_the_canonical_form_computes_the_folded_attention_per_head() -> None:
    """Through the pre-passes' shape inference (onnxruntime's names the folded batch
    ``2*batch``) and the canonical form, no pattern: the three folds and the context's
    merge read batch-first (``sequence_first_fold``), the Softmax and both products per
    head (``heads_in_batch``); no rank-3 product or Softmax is left."""
    model = block(WAVLM)
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[], value_info="all")
    canonical = canonical.to_proto()
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in canonical.graph.value_info}
    ranks |= {v.name: len(v.type.tensor_type.shape.dim) for v in canonical.graph.output}
    inner = [n for n in canonical.graph.node if n.op_type in ("MatMul", "Softmax")]
    inner = [n for n in inner if n.input[0] != "xs"]  # not the projections
    assert [(n.op_type, ranks.get(n.output[0])) for n in inner] == [
        ("MatMul", 4),  # the gate, per head already
        ("MatMul", 4),  # q k^T
        ("Softmax", 4),
        ("MatMul", 4),  # probs v
    ], inner
    for batch in (1, 3):
        run_both(model, canonical, feeds=feeds(WAVLM, batch), **MOVED)


def test_a_fold_a_reshape_splits_is_left_to_sequence_first_heads() -> None:
    """nn.MultiheadAttention's SDPA path splits the fold ``[B * N, S, H]`` into ``[B, N,
    S, H]`` by a Reshape: no bmm reads it, so the fold stays for ``sequence_first_heads``."""
    model = graph_model(
        ["float[6, 2, 32] x"],
        ["float[2, 4, 6, 8] y"],
        [
            "r = Reshape (x, flat)",
            "t = Transpose <perm = [1, 0, 2]> (r)",
            "h = Reshape (t, heads)",
            "y = Mul (h, two)",
        ],
        {
            "flat": np.array([6, 8, 8], np.int64),
            "heads": np.array([2, 4, 6, 8], np.int64),
            "two": TWO,
        },
    )
    _, done, _, _ = canonical_twice(model)
    assert "sequence_first_fold" not in done and done.get("sequence_first_heads") == 1, done


def test_folded_scores_whose_context_no_merge_reads_stay_folded() -> None:
    """The context left sequence-first (``[S, B * N, H]``, no merge of the heads after
    it): the folds read batch-first, but the Softmax and the products stay over the
    folded heads (``heads_in_batch`` unfolds only for a split)."""
    body = [
        "q = Mul (x, two)",
        "k = Add (x, two)",
        "v = Sub (x, two)",
        *(f"{p}f = Reshape ({p}, fold)" for p in "qkv"),
        *FOLD_ATTENTION,
        "y = Mul (ct, two)",
    ]
    inits = {"fold": np.array([6, -1, 4], np.int64), "two": TWO}
    model = graph_model(["float[6, batch, 8] x"], ["float[6, ?, 4] y"], body, inits)
    _, done, _, _ = canonical_twice(model)
    assert done.get("sequence_first_fold") == 3 and "heads_in_batch" not in done, done
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[], value_info="all")
    canonical = canonical.to_proto()
    softmax = next(n for n in canonical.graph.node if n.op_type == "Softmax")
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in canonical.graph.value_info}
    assert ranks[softmax.output[0]] == 3
    x = np.random.default_rng(3).standard_normal((6, 2, 8)).astype(np.float32)
    run_both(model, canonical, feeds={"x": x}, **MOVED)
