"""``identity_zero_add``: ``x + zeros`` is ``x`` where the zeros are proven no larger than
``x`` on any axis.

GPT-NeoX-Japanese computes its scores as ``torch.baddbmm(zeros, q3, k3^T, beta=1,
alpha=1 / norm)`` on heads folded into the batch: dynamo writes the zeros as
``Expand(0, [B * N, S, T])``, TorchScript as ``ConstantOfShape([B * N, S, T]) * beta``,
and the Add hides the scores' scale from the attention pattern. A generator (hypothesis)
writes that attention block with the zeros in random spellings (a constant of any shape
that fits, ``Expand`` of a zero scalar to the folded shape, ``ConstantOfShape`` with or
without its value, times a finite ``beta``) on either side of the Add: every block fuses
into exactly one MultiHeadAttention and computes what the original computes. Adds that
are no identity stay: zeros that broadcast the other operand larger, zeros whose shape
is read from a value the graph does not tie to it, a constant that is not all zero, a
non-finite ``beta``.

Tolerance: the canonical form alone is exact (rtol = atol = 0: it only takes ``+ 0``
away); the fused block rtol = atol = 1e-5, as in test_encoder_attention_spellings.py
(the kernel sums in another order). The example budget is
``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import build_model, fuse_quiet, optimize_quiet, run_both
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

EXACT = dict(rtol=0, atol=0)
TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN, SEQ = 16, 5
LOWEST = float(np.finfo(np.float32).min)
# ``zeros`` as exporters write them; ``zshape`` is the folded scores' shape [B * N, S, S]
ZEROS = {
    "scalar": ["zeros = Identity (zero_f)"],
    "row": ["zeros = Identity (zero_row)"],  # a constant [1, 1, S] of zeros
    "expand": ["zeros = Expand (zero_f, zshape)"],  # dynamo's torch.zeros
    "of_shape": ["zeros = ConstantOfShape (zshape)"],  # a float 0 by default
    "of_shape_value": ["zeros = ConstantOfShape <value = float[1] {0.0}> (zshape)"],
    "beta": ["raw = ConstantOfShape (zshape)", "zeros = Mul (raw, beta)"],  # TorchScript
    "beta_first": ["raw = Expand (zero_f, zshape)", "zeros = Mul (beta, raw)"],
}


@dataclass(frozen=True)
class Block:
    heads: int
    zeros: str  # a key of ZEROS
    zeros_first: bool  # Add(zeros, scores) rather than Add(scores, zeros)
    beta: float


@st.composite
def blocks(draw) -> Block:
    return Block(
        heads=draw(st.sampled_from([2, 4])),
        zeros=draw(st.sampled_from(sorted(ZEROS))),
        zeros_first=draw(st.booleans()),
        beta=draw(st.sampled_from([1.0, 0.5, -2.0])),  # -2: 0 * -2 is -0, still a zero
    )


def _inits(b: Block, rng: np.random.Generator) -> dict:
    n, h = b.heads, HIDDEN // b.heads
    inits = {f"w{p}": rng.standard_normal((HIDDEN, HIDDEN)) * 0.3 for p in "qkvo"}
    return inits | {
        "split": np.array([0, 0, n, h], np.int64),
        "fold": np.array([-1, SEQ, h], np.int64),
        "fold_scores": np.array([-1, SEQ, SEQ], np.int64),
        "unfold_tail": np.array([n, SEQ, SEQ], np.int64),
        "context_tail": np.array([n, SEQ, h], np.int64),
        "heads": np.array([n], np.int64),
        "seq": np.array([SEQ], np.int64),
        "batch_axis": np.array([0], np.int64),
        "pad_axes": np.array([1, 2], np.int64),
        "merge": np.array([0, 0, HIDDEN], np.int64),
        "alpha": np.array(h**-0.5, np.float32),
        "beta": np.array(b.beta, np.float32),
        "zero_f": np.array(0.0, np.float32),
        "zero_row": np.zeros((1, 1, SEQ), np.float32),
        "lowest": np.array(LOWEST, np.float32),
    }


def attention_block(b: Block, seed: int = 0) -> onnx.ModelProto:
    """GPT-NeoX-Japanese's attention: bmm over ``[B * N, S, H]``, the scores plus zeros
    (``baddbmm``), unfolded for the padding mask, the Softmax over ``[B, N, S, S]``."""
    added = "Add (zeros, scaled3)" if b.zeros_first else "Add (scaled3, zeros)"
    body = [
        *[f"{p}m = MatMul (x, w{p})" for p in "qkv"],
        *[f"{p}h = Reshape ({p}m, split)" for p in "qkv"],
        *[f"{p}t = Transpose <perm = [0, 2, 1, 3]> ({p}h)" for p in "qkv"],
        *[f"{p}3 = Reshape ({p}t, fold)" for p in "qkv"],
        "kT3 = Transpose <perm = [0, 2, 1]> (k3)",
        "scores3 = MatMul (q3, kT3)",
        "scaled3 = Mul (scores3, alpha)",
        "x_shape = Shape (x)",
        "batch = Gather (x_shape, batch_axis)",
        "rows = Mul (batch, heads)",
        "zshape = Concat <axis = 0> (rows, seq, seq)",
        *ZEROS[b.zeros],
        f"biased3 = {added}",
        "unfold = Concat <axis = 0> (batch, unfold_tail)",
        "scores = Reshape (biased3, unfold)",
        "keep_u = Unsqueeze (attention_mask, pad_axes)",
        "keep = Cast <to = 9> (keep_u)",
        "bias = Where (keep, zero_f, lowest)",
        "masked = Add (scores, bias)",
        "probs = Softmax <axis = -1> (masked)",
        "probs3 = Reshape (probs, fold_scores)",
        "context3 = MatMul (probs3, v3)",
        "context_unfold = Concat <axis = 0> (batch, context_tail)",
        "context = Reshape (context3, context_unfold)",
        "ct = Transpose <perm = [0, 2, 1, 3]> (context)",
        "merged = Reshape (ct, merge)",
        "y = MatMul (merged, wo)",
    ]
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, {SEQ}, {HIDDEN}] x, int64[batch, {SEQ}] attention_mask)
      => (float[batch, {SEQ}, {HIDDEN}] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, _inits(b, np.random.default_rng(seed)))


def feeds(batch: int) -> dict:
    rng = np.random.default_rng(batch)
    mask = np.ones((batch, SEQ), np.int64)
    mask[-1, 3:] = 0  # the last row padded on the right
    return {
        "x": rng.standard_normal((batch, SEQ, HIDDEN)).astype(np.float32),
        "attention_mask": mask,
    }


@SPELLINGS
@given(blocks())
def test_scores_plus_zeros_in_any_spelling_fuse_into_one_attention(b: Block) -> None:
    model = attention_block(b)
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    readers = [n for n in canonical.graph.node if "biased3" in n.input or "zeros" in n.input]
    assert not readers, f"{b}: the zero Add stays: {[n.op_type for n in readers]}"
    run_both(model, canonical, feeds=feeds(2), **EXACT)
    done = fuse_quiet(model, exclude=["qkv_merge", "kv_merge"])
    attention = done.ops_among(("MultiHeadAttention", "GroupQueryAttention", "Attention"))
    assert len(attention) == 1, f"{b}: {done.ops}; {done.misses_about('attention')[:3]}"
    assert "Softmax" not in done.ops, b
    for batch in (1, 3):
        run_both(model, done.model, feeds=feeds(batch), **TOL)


# ``y = -(x + zeros)`` for ``x`` float[batch, 3, n]: zeros that are no identity there
KEPT = {
    # broadcasts x larger: [batch, 3, n] + [1, 3, 4] is [batch, 3, 4] at n = 1
    "larger": ["zeros = Expand (zero_f, larger_shape)"],
    "more_axes": ["zeros = Identity (zero_cube)"],  # [2, 1, 1, 1]: one more axis
    # shaped from another input, whose last size nothing ties to x's
    "other_input": ["other_shape = Shape (other)", "zeros = Expand (zero_f, other_shape)"],
    "not_zero": ["zeros = Identity (half)"],
    "infinite_beta": ["raw = Expand (zero_f, own_shape)", "zeros = Mul (raw, inf)"],
}
# the control: zeros shaped as x itself go
DROPPED = {"own_shape": ["zeros = Expand (zero_f, own_shape)"]}


@pytest.mark.parametrize("reader", ["Softmax", "Neg"])
@pytest.mark.parametrize("spelling", sorted(KEPT) + sorted(DROPPED))
def test_adds_of_zeros_that_change_the_shape_or_value_stay(spelling: str, reader: str) -> None:
    """Zeros that broadcast x larger, or are not zeros, stay; zeros shaped as x go on the
    way to a Softmax (scores) and stay elsewhere (a mixture of experts' ``index_add``
    starts its sum from zeros, which its recognizer reads whole)."""
    out = "p, batch, 3, k" if spelling == "more_axes" else "batch, 3, k"
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, 3, n] x, float[batch, 3, m] other) => (float[{out}] y) {{
        own_shape = Shape (x)
        {chr(10).join({**KEPT, **DROPPED}[spelling])}
        s = Add (x, zeros)
        y = {reader} (s)
    }}"""
    inits = {
        "zero_f": np.array(0.0, np.float32),
        "larger_shape": np.array([1, 3, 4], np.int64),
        "zero_cube": np.zeros((2, 1, 1, 1), np.float32),
        "half": np.array(0.5, np.float32),
        "inf": np.array(np.inf, np.float32),
    }
    model = build_model(text, inits)
    canonical = optimize_quiet(model, target="onnxruntime", patterns=[]).to_proto()
    kept = "Add" in [n.op_type for n in canonical.graph.node]
    assert kept == (spelling in KEPT or reader != "Softmax"), spelling
    rng = np.random.default_rng(0)
    data = {
        "x": rng.standard_normal((2, 3, 1)).astype(np.float32),
        "other": rng.standard_normal((2, 3, 4)).astype(np.float32),
    }
    run_both(model, canonical, feeds=data, **EXACT)
