"""Rule ``subtracted_bias``: a mask subtracted from attention scores, ``s - c * x``
(Funnel's ``- 1e6 * (1 - m)``), is added as ``s + (-c) * x``, and the attention fuses.

A hypothesis generator draws the spelling: scores by MatMul or Funnel's Einsum, the
scale on the query or on the scores, the factor ``c`` and its side of the Mul, the mask
an integer ``m`` made ``1 - m`` or a float mask, and the sizes. The fused model must
equal the original at rtol = atol = 1e-5 (the attention op sums in another order).
Negative cases (no constant factor, a factor per head, no Softmax reading the
difference) stay Subs, and a Sub rewritten where no attention fuses is written back.
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
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
ATTENTION = ("MultiHeadAttention", "Attention")


def attention(scores: str, mask: str, extra: str = "", heads: int = 2, size: int = 4, axis=-1):
    """Funnel-like attention: projections split into ``[B, S, N, H]`` heads, ``scores``
    (lines ending in ``z``, the Softmax's input; ``mask`` makes ``pen``), the context
    ``einsum("bnij,bjnd->bind")`` merged back and projected."""
    hidden = heads * size
    rng = np.random.default_rng(0)
    inits = {f"w{p}": rng.standard_normal((hidden, hidden)).astype(np.float32) for p in "qkvo"}
    inits |= {f"b{p}": rng.standard_normal(hidden).astype(np.float32) for p in "qkv"}
    inits["heads"] = np.array([0, 0, heads, size], np.int64)
    inits["merged"] = np.array([0, 0, hidden], np.int64)
    inits["scale"] = np.array(1 / np.sqrt(size), np.float32)
    inits["axes12"] = np.array([1, 2], np.int64)
    inits["one"] = np.array(1.0, np.float32)
    inits["perhead"] = rng.uniform(1, 2, (1, heads, 1, 1)).astype(np.float32)
    proj = "\n".join(
        f"{p}_mm = MatMul (x, w{p})\n{p}_b = Add ({p}_mm, b{p})\n{p} = Reshape ({p}_b, heads)"
        for p in "qkv"
    )
    inputs = f"float[batch, seq, {hidden}] x, int64[batch, seq] m{extra}"
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g ({inputs}) => (float[batch, seq, {hidden}] y) {{
        {proj}
        {mask}
        {scores}
        p = Softmax <axis = {axis}> (z)
        c = Einsum <equation = "bnij,bjnd->bind"> (p, v)
        merged_c = Reshape (c, merged)
        y = MatMul (merged_c, wo)
    }}"""
    return build_model(text, inits)


def scores_lines(by_einsum: bool, scale_query: bool) -> str:
    """Lines computing ``u``, the scaled scores, from the heads ``q``, ``k``."""
    query, product = ("qs", "u") if scale_query else ("q", "s0")
    lines = ["qs = Mul (q, scale)"] if scale_query else []
    if by_einsum:
        lines.append(f'{product} = Einsum <equation = "bind,bjnd->bnij"> ({query}, k)')
    else:
        lines += [
            f"qt = Transpose <perm = [0, 2, 1, 3]> ({query})",
            "kt = Transpose <perm = [0, 2, 3, 1]> (k)",
            f"{product} = MatMul (qt, kt)",
        ]
    if not scale_query:
        lines.append("u = Mul (s0, scale)")
    return "\n".join(lines)


@st.composite
def spellings(draw):
    """(model, feeds' seed): a subtracted mask in a random spelling."""
    factor = draw(st.sampled_from([1e6, 1e4, 10000.0, 3.0]))
    inits_c = f"cf = Constant <value = float {{{factor!r}}}> ()"
    cast = "mf = Cast <to = 1> (m)\nmu = Unsqueeze (mf, axes12)\ninv = Sub (one, mu)"
    mul = "pen = Mul (inv, cf)" if draw(st.booleans()) else "pen = Mul (cf, inv)"
    mask = f"{inits_c}\n{cast}\n{mul}"
    scores = scores_lines(draw(st.booleans()), draw(st.booleans())) + "\nz = Sub (u, pen)"
    return attention(scores, mask), factor


def feeds(seed: int, batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = (rng.uniform(size=(batch, seq)) < 0.7).astype(np.int64)
    mask[:, 0] = 1  # a row of all keys masked is a tie the Softmax splits evenly: not mine
    return {"x": rng.standard_normal((batch, seq, 8)).astype(np.float32), "m": mask}


@SPELLINGS
@given(case=spellings(), seed=st.integers(0, 2**16))
def test_a_subtracted_mask_is_added_and_the_attention_fuses(case, seed) -> None:
    model, _factor = case
    _canonical, done, again, _work = canonical_twice(model)
    assert done.get("subtracted_bias") == 1 and again == 0, done
    fused = fuse_quiet(model)
    assert len(fused.ops_among(ATTENTION)) == 1, (fused.ops, fused.misses_about("attention"))
    assert "Softmax" not in fused.ops, fused.ops
    onnx.checker.check_model(fused.model, full_check=True)
    for batch, seq in ((1, 1), (2, 5)):
        run_both(model, fused.model, feeds=feeds(seed, batch, seq), **TOL)


def test_subtractions_of_no_scalar_factor_or_no_softmax_stay() -> None:
    mask = "mf = Cast <to = 1> (m)\nmu = Unsqueeze (mf, axes12)\ninv = Sub (one, mu)"
    scores = scores_lines(by_einsum=False, scale_query=False)
    cases = {
        "no factor": (f"{scores}\nz = Sub (u, inv)", ""),
        "a factor per head": (f"{scores}\npen = Mul (inv, perhead)\nz = Sub (u, pen)", ""),
        "a factor not constant": (f"{scores}\npen = Mul (inv, f)\nz = Sub (u, pen)", ", float f"),
    }
    for name, (lines, extra) in cases.items():
        _canonical, done, _again, _work = canonical_twice(attention(lines, mask, extra))
        assert "subtracted_bias" not in done, (name, done)
    text = """<ir_version: 8, opset_import: ["" : 18]>
    g (float[2, 3] s, float[2, 3] x) => (float[2, 3] y) {
        c = Constant <value = float {1000000.0}> ()
        pen = Mul (x, c)
        y = Sub (s, pen)
    }"""
    canonical, done, _again, _work = canonical_twice(build_model(text))
    assert "subtracted_bias" not in done and op_sequence(canonical) == ["Constant", "Mul", "Sub"]


def test_a_subtracted_mask_no_attention_takes_is_written_back() -> None:
    """A Softmax over the queries (axis 2), which no attention computes: the Sub comes
    back."""
    mask = "cf = Constant <value = float {1000000.0}> ()\nmf = Cast <to = 1> (m)\n"
    mask += "mu = Unsqueeze (mf, axes12)\ninv = Sub (one, mu)\npen = Mul (inv, cf)"
    model = attention(scores_lines(False, False) + "\nz = Sub (u, pen)", mask, axis=2)
    before = op_sequence(model)
    assert canonical_twice(model)[1].get("subtracted_bias") == 1
    fused = fuse_quiet(model)
    assert not fused.ops_among(ATTENTION), fused.ops
    assert fused.ops.count("Sub") == 2 and "Softmax" in fused.ops, fused.ops  # 1 - m, s - pen
    assert fused.ops.count("Mul") == before.count("Mul"), (before, fused.ops)
    run_both(model, fused.model, feeds=feeds(3, 2, 5), **TOL)


@pytest.mark.parametrize("subtracted", [False, True])
def test_a_bias_and_an_unsqueezed_integer_mask_are_summed_and_fuse(subtracted) -> None:
    """``(s + position) + (1 - Unsqueeze(Cast(m))) * -1e30`` (or ``- 1e30 * ...``):
    ``one_bias`` reads the mask through its Unsqueeze, so the scores take one bias."""
    sign, combine = ("", "Sub") if subtracted else ("-", "Add")
    mask = f"cf = Constant <value = float {{{sign}1e30}}> ()\nmf = Cast <to = 1> (m)\n"
    mask += "mu = Unsqueeze (mf, axes12)\ninv = Sub (one, mu)\npen = Mul (inv, cf)"
    lines = scores_lines(True, True) + f"\nu2 = Add (u, pos)\nz = {combine} (u2, pen)"
    model = attention(lines, mask, ", float[batch, 2, seq, seq] pos")
    _canonical, done, again, _work = canonical_twice(model)
    assert done.get("one_bias") == 1 and again == 0, done
    fused = fuse_quiet(model)
    assert len(fused.ops_among(ATTENTION)) == 1, (fused.ops, fused.misses_about("attention"))
    for batch, seq in ((1, 1), (2, 5)):
        inputs = feeds(seq, batch, seq)
        inputs["pos"] = np.random.default_rng(seq).standard_normal((batch, 2, seq, seq))
        inputs["pos"] = inputs["pos"].astype(np.float32)
        run_both(model, fused.model, feeds=inputs, **TOL)
