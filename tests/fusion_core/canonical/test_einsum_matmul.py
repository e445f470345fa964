"""Rule ``einsum_matmul`` on generated equations: a two-operand Einsum of one batched dot
product (batch indices in both operands and the output, one contracted index, free
indices of each operand in the output) becomes Transposes (an Unsqueeze where both
operands have several free indices) and a MatMul.

A hypothesis generator draws the equation (how many batch and free indices, their
letters, each term's order, an explicit or implicit output), the sizes and the opset
(Unsqueeze's axes an attribute before 13); the rewritten graph must equal numpy's einsum
and onnxruntime's Einsum at rtol = 1e-5, atol = 1e-6 (one dot product's additions may be
summed in another order). Equations outside the class stay Einsums. Funnel's attention,
scores and context written as Einsums, fuses into one attention op.
``AUTOFUSION_SPELLING_EXAMPLES`` sets the example budget (25 in ``make test``).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.testing import (
    build_model,
    canonical_twice,
    fuse_quiet,
    op_sequence,
    run_both,
)
from autofusion.fusion_core.validate import make_session
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

CLOSE = dict(rtol=1e-5, atol=1e-6)
ATTENTION_TOL = dict(rtol=1e-5, atol=1e-5)
LETTERS = "abcdefghijklmnopqrstuvwxyz"


def einsum_model(equation: str, a: tuple[int, ...], b: tuple[int, ...], opset: int = 18):
    """One Einsum of two graph inputs of the given shapes (its output's, numpy's)."""
    out = np.einsum(equation, np.zeros(a), np.zeros(b)).shape

    def dims(shape: tuple[int, ...]) -> str:
        return ", ".join(map(str, shape))

    text = f"""<ir_version: 8, opset_import: ["" : {opset}]>
    g (float[{dims(a)}] a, float[{dims(b)}] b) => (float[{dims(out)}] y) {{
        y = Einsum <equation = "{equation}"> (a, b)
    }}"""
    return build_model(text)


@st.composite
def equations(draw):
    """(equation, shape of a, shape of b): a batched dot product of random letters,
    term orders and sizes."""
    counts = [draw(st.integers(0, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 2))]
    letters = draw(st.permutations(LETTERS))[: sum(counts) + 1]
    batch, free_a = letters[: counts[0]], letters[counts[0] : counts[0] + counts[1]]
    free_b, summed = letters[counts[0] + counts[1] : -1], letters[-1:]
    term_a = "".join(draw(st.permutations(batch + free_a + summed)))
    term_b = "".join(draw(st.permutations(batch + free_b + summed)))
    out = "".join(draw(st.permutations(batch + free_a + free_b)))
    if not batch and draw(st.booleans()):  # implicit: the indices seen once, sorted
        equation = f"{term_a},{term_b}"
    else:
        equation = f"{term_a},{term_b}->{out}"
    size = {c: draw(st.integers(1, 4)) for c in letters}
    return equation, tuple(size[c] for c in term_a), tuple(size[c] for c in term_b)


@SPELLINGS
@given(case=equations(), opset=st.sampled_from([12, 13, 18]), seed=st.integers(0, 2**16))
def test_a_batched_dot_product_einsum_becomes_a_matmul(case, opset, seed) -> None:
    equation, a_shape, b_shape = case
    model = einsum_model(equation, a_shape, b_shape, opset)
    canonical, done, again, _work = canonical_twice(model)
    assert done.get("einsum_matmul") == 1 and again == 0, (equation, done)
    ops = op_sequence(canonical)
    assert ops.count("MatMul") == 1 and set(ops) <= {"Transpose", "Unsqueeze", "MatMul"}, ops
    onnx.checker.check_model(canonical, full_check=True)
    rng = np.random.default_rng(seed)
    feeds = {
        "a": rng.standard_normal(a_shape).astype(np.float32),
        "b": rng.standard_normal(b_shape).astype(np.float32),
    }
    run_both(model, canonical, feeds=feeds, **CLOSE)  # against onnxruntime's Einsum
    (got,) = make_session(canonical).run(None, feeds)
    want = np.einsum(equation, feeds["a"].astype(np.float64), feeds["b"].astype(np.float64))
    np.testing.assert_allclose(got, want, **CLOSE)


@SPELLINGS
@given(case=equations(), opset=st.sampled_from([12, 13, 18]), seed=st.integers(0, 2**16))
def test_an_einsum_no_fusion_takes_is_written_back(case, opset, seed) -> None:
    """Through the whole pipeline with no pattern to fuse, the rule's chain goes back to
    the one Einsum (Mamba's scans stay one node each), computing what it did."""
    equation, a_shape, b_shape = case
    model = einsum_model(equation, a_shape, b_shape, opset)
    fused = fuse_quiet(model, patterns=[])
    assert op_sequence(fused.model) == ["Einsum"], (equation, op_sequence(fused.model))
    rng = np.random.default_rng(seed)
    feeds = {
        "a": rng.standard_normal(a_shape).astype(np.float32),
        "b": rng.standard_normal(b_shape).astype(np.float32),
    }
    run_both(model, fused.model, feeds=feeds, rtol=0, atol=0)  # the same op on the same data


def test_einsums_of_no_single_dot_product_stay() -> None:
    """Two contracted indices, none, an index summed over one operand alone, one
    repeated in a term, an ellipsis, or integers (MatMul takes fewer types)."""
    cases = [
        ("bij,bij->b", (2, 3, 4), (2, 3, 4)),  # two contracted
        ("ij,kl->ijkl", (2, 3), (4, 5)),  # outer product: none contracted
        ("ij,jk->i", (2, 3), (3, 4)),  # k summed over b alone
        ("iij,jk->ik", (2, 2, 3), (3, 4)),  # a diagonal
        ("...ij,...jk->...ik", (2, 3, 4), (2, 4, 5)),  # an ellipsis
        ("ij,j->i", (2, 3), (3,)),  # b has no free index
    ]
    for equation, a, b in cases:
        canonical, done, _again, _work = canonical_twice(einsum_model(equation, a, b))
        assert "einsum_matmul" not in done, (equation, done)
        assert op_sequence(canonical) == ["Einsum"], equation
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (int32[2, 3] a, int32[3, 4] b) => (int32[2, 4] y) {
        y = Einsum <equation = "ij,jk->ik"> (a, b)
    }"""
    canonical, done, _again, _work = canonical_twice(build_model(text))
    assert "einsum_matmul" not in done and op_sequence(canonical) == ["Einsum"], done


def funnel_attention(heads: int = 2, head_size: int = 4) -> onnx.ModelProto:
    """Funnel's content attention: projections split into heads ``[B, S, N, H]``, the
    scores ``einsum("bind,bjnd->bnij")`` scaled, a Softmax, the context
    ``einsum("bnij,bjnd->bind")`` merged back and projected."""
    hidden = heads * head_size
    rng = np.random.default_rng(0)
    inits = {f"w{p}": rng.standard_normal((hidden, hidden)).astype(np.float32) for p in "qkvo"}
    inits |= {f"b{p}": rng.standard_normal(hidden).astype(np.float32) for p in "qkv"}
    inits["heads"] = np.array([0, 0, heads, head_size], np.int64)
    inits["merged"] = np.array([0, 0, hidden], np.int64)
    inits["scale"] = np.array(1 / np.sqrt(head_size), np.float32)
    proj = "\n".join(
        f"{p}_mm = MatMul (x, w{p})\n{p}_b = Add ({p}_mm, b{p})\n{p} = Reshape ({p}_b, heads)"
        for p in "qkv"
    )
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[batch, seq, {hidden}] x) => (float[batch, seq, {hidden}] y) {{
        {proj}
        s = Einsum <equation = "bind,bjnd->bnij"> (q, k)
        scaled = Mul (s, scale)
        p = Softmax <axis = -1> (scaled)
        c = Einsum <equation = "bnij,bjnd->bind"> (p, v)
        m = Reshape (c, merged)
        y = MatMul (m, wo)
    }}"""
    return build_model(text, inits)


def test_funnels_einsum_attention_fuses_into_one_attention_op() -> None:
    model = funnel_attention()
    fused = fuse_quiet(model)
    attention = fused.ops_among(("MultiHeadAttention", "Attention"))
    assert len(attention) == 1, (fused.ops, fused.misses_about("attention"))
    assert "Einsum" not in fused.ops and "Softmax" not in fused.ops, fused.ops
    onnx.checker.check_model(fused.model, full_check=True)
    rng = np.random.default_rng(1)
    for batch, seq in ((1, 1), (2, 5)):
        feeds = {"x": rng.standard_normal((batch, seq, 8)).astype(np.float32)}
        run_both(model, fused.model, feeds=feeds, **ATTENTION_TOL)
