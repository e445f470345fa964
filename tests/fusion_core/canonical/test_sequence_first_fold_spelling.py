"""Generated: WavLM's attention folded into the batch from a sequence-first layout
(``tests/fusion_core/wavlm_text.py``) at random sizes and in each spelling fuses into
one MultiHeadAttention that computes what the block does.

Drawn: the sequence S (fixed in the graph), heads N, head size H; the scale on q
before the bmm or on the scores after it; the position bias gated per head by a sigmoid
of the query (WavLM) or plain; the bias repeated over the batch by Tile or by Expand.
Each case runs at two batch sizes (1, where a broadcast could hide a wrong fold, and
3). Tolerance: rtol = atol = 1e-5 (float32; onnxruntime's attention kernel sums in
another order).
"""

from __future__ import annotations

import pytest
from hypothesis import given, note
from hypothesis import strategies as st

from autofusion.fusion_core.testing import fuse_quiet, run_both
from tests.fusion_core.spelling_settings import SPELLINGS
from tests.fusion_core.wavlm_text import Spelling, block, feeds

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)

SPELLING = st.builds(
    Spelling,
    seq=st.integers(2, 9),
    heads=st.integers(1, 4),
    size=st.sampled_from([2, 3, 4, 8]),
    scale_on_q=st.booleans(),
    gated=st.booleans(),
    tile=st.booleans(),
)


@SPELLINGS
@given(spelling=SPELLING, seed=st.integers(0, 2**16))
def test_the_folded_sequence_first_attention_fuses_once_in_every_spelling(spelling, seed):
    note(spelling)
    model = block(spelling, seed)
    fused = fuse_quiet(model)
    assert fused.result.counts.get("attention") == 1, fused.misses_about("attention")
    assert fused.ops_among(("MultiHeadAttention", "Softmax")) == ["MultiHeadAttention"]
    for batch in (1, 3):
        run_both(model, fused.model, feeds=feeds(spelling, batch, seed), **TOL)
