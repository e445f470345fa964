"""Rule ``flat_head_split``: LeViT's attention as dynamo's optimizer writes it, the heads
split straight from the BatchNorm'd ``[B * S, C]`` rows (``Reshape(rows, [-1, S, N,
P])``, then each head's ``[kd, kd, vd]`` parts by a Split or by Slices), fuses once and
computes what the block did. The rows read as ``[B, S, C]`` are the same elements in the
same order, so the rewrite is exact; the fused op sums in another order: rtol = atol =
1e-5, as tests/fusion_core/canonical/test_value_scale.py (outputs differ by about 1e-6
at these sizes). Where nothing fuses the graph comes out as it went in, bit for bit."""

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

TOL = dict(rtol=1e-5, atol=1e-5)
EXACT = dict(rtol=0, atol=0)
SEQ, DIM = 6, 16


@dataclass(frozen=True)
class Flat:
    """One spelling: heads, the key and value sizes, the parts split or sliced, the
    scale a Mul or a Div, a learned bias on the scores or none."""

    heads: int = 2
    kd: int = 8
    vd: int = 16
    parts: str = "split"
    scale: str = "Mul"
    bias: bool = True


def _parts(f: Flat) -> str:
    """The q, k and v parts of each head: one Split, or three Slices of the last axis."""
    if f.parts == "split":
        return "q, k, v = Split <axis = 3> (heads, sizes)"
    slices = [f"{n} = Slice (heads, s{i}, s{i + 1}, axis3)" for i, n in enumerate("qkv")]
    return "\n    ".join(slices)


def flat_block(f: Flat) -> onnx.ModelProto:
    """``x [B, S, D]`` flattened to rows, projected and BatchNorm'd (Mul, Add), the heads
    split from the rows, attention with a learned bias, the context merged."""
    part = 2 * f.kd + f.vd
    channels = f.heads * part
    bias = "scored = Add (scaled, attention_bias)" if f.bias else "scored = Identity (scaled)"
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, {SEQ}, {DIM}] x) => (float[batch, {SEQ}, {f.heads * f.vd}] y) {{
    rows = Reshape (x, flat)
    projected = MatMul (rows, w)
    normed = Mul (projected, gamma)
    shifted = Add (normed, beta)
    heads = Reshape (shifted, target)
    {_parts(f)}
    qt = Transpose <perm = [0, 2, 1, 3]> (q)
    kt = Transpose <perm = [0, 2, 3, 1]> (k)
    vt = Transpose <perm = [0, 2, 1, 3]> (v)
    scores = MatMul (qt, kt)
    scaled = {f.scale} (scores, factor)
    {bias}
    probs = Softmax <axis = -1> (scored)
    context = MatMul (probs, vt)
    ct = Transpose <perm = [0, 2, 1, 3]> (context)
    y = Reshape (ct, merged)
}}"""
    rng = np.random.default_rng(f.heads * 100 + f.kd + f.vd)
    size = float(np.sqrt(f.kd))
    inits = {
        "flat": np.array([-1, DIM], np.int64),
        "target": np.array([-1, SEQ, f.heads, part], np.int64),
        "merged": np.array([-1, SEQ, f.heads * f.vd], np.int64),
        "sizes": np.array([f.kd, f.kd, f.vd], np.int64),
        "w": rng.standard_normal((DIM, channels)) / 4,
        "gamma": rng.uniform(0.5, 1.5, channels),
        "beta": rng.standard_normal(channels) / 4,
        "factor": np.array(1 / size if f.scale == "Mul" else size),
        "attention_bias": rng.standard_normal((1, f.heads, SEQ, SEQ)),
    }
    cuts = np.array([0, f.kd, 2 * f.kd, part], np.int64)
    inits.update({f"s{i}": cuts[i : i + 1] for i in range(4)} | {"axis3": np.array([3])})
    return build_model(text, inits)


flats = st.builds(
    Flat,
    heads=st.sampled_from([2, 4]),
    kd=st.sampled_from([4, 8]),
    vd=st.sampled_from([8, 16]),
    parts=st.sampled_from(["split", "slices"]),
    scale=st.sampled_from(["Mul", "Div"]),
    bias=st.booleans(),
)


def _feeds(batch: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    return {"x": rng.standard_normal((batch, SEQ, DIM)).astype(np.float32)}


@SPELLINGS
@given(flat=flats)
def test_heads_split_from_flat_rows_fuse_once(flat: Flat) -> None:
    model = flat_block(flat)
    fused = fuse_quiet(model)
    assert "Softmax" not in fused.ops, fused.misses_about("attention")
    assert fused.ops_among(("Attention", "MultiHeadAttention")) == ["MultiHeadAttention"]
    for batch in (1, 3):
        run_both(model, fused.model, feeds=_feeds(batch), **TOL)


def test_nothing_fused_comes_out_as_it_went_in() -> None:
    model = flat_block(Flat())
    result = optimize_quiet(model, target="onnxruntime", exclude=["attention"])
    out = result.to_proto()
    reshapes = [n for n in out.graph.node if n.op_type == "Reshape"]
    assert len(reshapes) == 3, [n.name for n in reshapes]  # no [B, S, C] view left
    run_both(model, out, feeds=_feeds(2), **EXACT)


def test_a_reshape_that_is_no_head_split_stays() -> None:
    """``[-1, S, N, P]`` with ``N * P`` half the rows' width: the ``-1`` takes two rows
    each; that is no ``[B, S, C]`` view, and the rule leaves it (nothing fuses)."""
    flat = Flat(bias=False)
    model = flat_block(flat)
    part = 2 * flat.kd + flat.vd
    for init in model.graph.initializer:
        if init.name == "target":  # two sequences of half the heads each
            half = np.array([-1, SEQ, flat.heads // 2, part], np.int64)
            init.CopyFrom(onnx.numpy_helper.from_array(half, "target"))
    fused = fuse_quiet(model)
    assert "MultiHeadAttention" not in fused.ops
    assert not any("flat_head_split" in n.name for n in fused.model.graph.node)
