"""Rule ``scale_after_rotary``: ESM's attention, the query heads scaled by a number
between their head Transpose and the rotary embedding (``query * scaling``, then the
rotate-half rotary on constant ``[1, 1, S, H]`` tables), fuses once, in every spelling
drawn (a Mul or a Div, the constant on either side of the Mul, the head and the scale
sizes), and computes what the block did.

The rotary is linear in its input, so the scale moves after it exactly in real numbers;
in floating point ``(c x) cos`` and ``c (x cos)`` round apart by an ulp or so of each
product, as for ``scale_to_scores``, and the fused op sums in its own order: rtol = atol
= 1e-5 (measured about 1e-6 at these sizes, inputs and weights of order 1). A scale per
channel does not commute with the rotation (it mixes the halves): it stays, and nothing
fuses. Where the rotary fuses and the attention does not, the scale goes back before the
rotary, as the exporter wrote it."""

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
SEQ = 6


@dataclass(frozen=True)
class Scaled:
    """One spelling: heads, head size, the scale's op and side, its number."""

    heads: int = 2
    size: int = 8
    op: str = "Mul"
    left: bool = False  # Mul(c, q) rather than Mul(q, c)
    factor: str = "root"  # 1 / sqrt(H) (ESM's), or a power of two


def _rotated(name: str, source: str) -> str:
    """The rotate-half rotary of ``source`` by the constant tables, as ``name``."""
    return f"""{name}_1 = Slice ({source}, zero, half, three)
    {name}_2 = Slice ({source}, half, whole, three)
    {name}_n = Neg ({name}_2)
    {name}_r = Concat <axis = -1> ({name}_n, {name}_1)
    {name}_c = Mul ({source}, cos)
    {name}_s = Mul ({name}_r, sin)
    {name} = Add ({name}_c, {name}_s)"""


def scaled_block(f: Scaled, per_channel: bool = False) -> onnx.ModelProto:
    """Projections, the head split, the query scaled, both rotated, attention, merge."""
    dim = f.heads * f.size
    scale = f"{f.op} (c, qt)" if f.left and f.op == "Mul" else f"{f.op} (qt, c)"
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, {SEQ}, {dim}] x) => (float[batch, {SEQ}, {dim}] y) {{
    qp = MatMul (x, wq)
    kp = MatMul (x, wk)
    vp = MatMul (x, wv)
    q4 = Reshape (qp, split)
    k4 = Reshape (kp, split)
    v4 = Reshape (vp, split)
    qt = Transpose <perm = [0, 2, 1, 3]> (q4)
    kt = Transpose <perm = [0, 2, 1, 3]> (k4)
    vt = Transpose <perm = [0, 2, 1, 3]> (v4)
    qs = {scale}
    {_rotated("qr", "qs")}
    {_rotated("kr", "kt")}
    kT = Transpose <perm = [0, 1, 3, 2]> (kr)
    scores = MatMul (qr, kT)
    probs = Softmax <axis = -1> (scores)
    context = MatMul (probs, vt)
    ct = Transpose <perm = [0, 2, 1, 3]> (context)
    y = Reshape (ct, merge)
}}"""
    return build_model(text, _weights(f, per_channel))


def _weights(f: Scaled, per_channel: bool) -> dict[str, np.ndarray]:
    dim, half = f.heads * f.size, f.size // 2
    rng = np.random.default_rng(dim + f.size)
    angles = np.arange(SEQ)[:, None] / 10000 ** (np.arange(half) / half)
    angles = np.concatenate([angles, angles], axis=-1)[None, None]
    number = 1 / np.sqrt(f.size) if f.factor == "root" else 0.25
    c = np.array(number if f.op == "Mul" else 1 / number)
    if per_channel:
        c = np.linspace(0.2, 0.4, f.size)
    return {
        **{w: rng.standard_normal((dim, dim)) / np.sqrt(dim) for w in ("wq", "wk", "wv")},
        "split": np.array([0, 0, f.heads, f.size], np.int64),
        "merge": np.array([0, 0, dim], np.int64),
        "cos": np.cos(angles),
        "sin": np.sin(angles),
        "c": c,
        **{k: np.array([v], np.int64) for k, v in (("zero", 0), ("three", 3))},
        "half": np.array([half], np.int64),
        "whole": np.array([f.size], np.int64),
    }


scalings = st.builds(
    Scaled,
    heads=st.sampled_from([2, 4]),
    size=st.sampled_from([8, 16]),
    op=st.sampled_from(["Mul", "Div"]),
    left=st.booleans(),
    factor=st.sampled_from(["root", "power"]),
)


def _x(model: onnx.ModelProto, batch: int) -> dict[str, np.ndarray]:
    dim = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    rng = np.random.default_rng(batch)
    return {"x": rng.standard_normal((batch, SEQ, dim)).astype(np.float32)}


@SPELLINGS
@given(scaled=scalings)
def test_a_query_scaled_before_its_rotary_fuses_once(scaled: Scaled) -> None:
    model = scaled_block(scaled)
    fused = fuse_quiet(model)
    assert "Softmax" not in fused.ops, fused.misses_about("attention")
    assert len(fused.ops_among(("Attention", "MultiHeadAttention"))) == 1, fused.ops
    for batch in (1, 3):
        run_both(model, fused.model, feeds=_x(model, batch), **TOL)


def test_a_scale_per_channel_stays_before_the_rotary() -> None:
    model = scaled_block(Scaled(), per_channel=True)
    fused = fuse_quiet(model)
    assert "Softmax" in fused.ops
    assert not any("scale_after_rotary" in n.name for n in fused.model.graph.node)
    run_both(model, fused.model, feeds=_x(model, 2), **TOL)


def test_a_scale_no_attention_took_goes_back_before_the_rotary() -> None:
    model = scaled_block(Scaled(op="Div"))
    out = optimize_quiet(model, target="onnxruntime", exclude=["attention"]).to_proto()
    producers = {o: n for n in out.graph.node for o in n.output}
    rotaries = [n for n in out.graph.node if n.op_type == "RotaryEmbedding"]
    assert len(rotaries) == 2, [n.op_type for n in out.graph.node]
    scaled = [producers.get(n.input[0]) for n in rotaries]
    assert sorted(p.op_type if p else "input" for p in scaled).count("Div") == 1, scaled
    run_both(model, out, feeds=_x(model, 2), **TOL)
