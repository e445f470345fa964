"""Rule ``flat_head_split``: LeViT's attention as dynamo's optimizer writes it, the heads
split straight from the BatchNorm'd ``[B * S, C]`` rows (``Reshape(rows, [-1, S, N,
P])``, then each head's ``[kd, kd, vd]`` parts by a Split or by Slices), fuses once and
computes what the block did. The rows read as ``[B, S, C]`` are the same elements in the
same order, so the rewrite is exact; the fused op sums in another order: rtol = atol =
1e-5, as tests/fusion_core/canonical/test_value_scale.py (outputs differ by about 1e-6
at these sizes). Where nothing fuses the graph comes out as it went in, bit for bit.

Dynamic-shape exports compute the targets from shapes (``Concat(Gather(Shape(x), 0),
Gather(Shape(x), 1), [N], [P])``, or ``-1`` first): ``fusion_core.sizes`` proves their
entries and the rows' target is computed from the head split's, so the batch and the
sequence stay dynamic; a head count the graph does not prove (a dimension of another
input) is no head split, and the rule leaves it."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autofusion.fusion_core.canonical import canonical_form
from autofusion.fusion_core.testing import build_model, fuse_quiet, optimize_quiet, run_both
from tests.fusion_core.lying_labels import inferred
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
    target: str = "constant"  # or computed from shapes: "shapes" ([B, S, N, P]), "minus"


def _parts(f: Flat) -> str:
    """The q, k and v parts of each head: one Split, or three Slices of the last axis."""
    if f.parts == "split":
        return "q, k, v = Split <axis = 3> (heads, sizes)"
    slices = [f"{n} = Slice (heads, s{i}, s{i + 1}, axis3)" for i, n in enumerate("qkv")]
    return "\n    ".join(slices)


_SHAPES = """
    dims = Shape (x)
    b = Gather <axis = 0> (dims, i0)
    s = Gather <axis = 0> (dims, i1)
    merged = Concat <axis = 0> (b, s, width)"""
_TARGETS = {
    "constant": "",
    "shapes": "target = Concat <axis = 0> (b, s, n, p)",
    "minus": "target = Concat <axis = 0> (minus, s, n, p)",
    # the head count read from another input's dimension: no proof of it
    "unproven": "count = Shape (sel)\n    target = Concat <axis = 0> (b, s, count, p)",
}


def flat_block(f: Flat) -> onnx.ModelProto:
    """``x [B, S, D]`` flattened to rows, projected and BatchNorm'd (Mul, Add), the heads
    split from the rows, attention with a learned bias, the context merged (the targets
    constants, or computed from ``x``'s shape with ``S`` dynamic and no bias)."""
    part = 2 * f.kd + f.vd
    channels = f.heads * part
    computed = f.target != "constant"
    with_bias = f.bias and not computed
    bias = "scored = Add (scaled, attention_bias)" if with_bias else "scored = Identity (scaled)"
    seq = "seq" if computed else SEQ
    sel = ", float[heads] sel" if f.target == "unproven" else ""
    reads = f"{_SHAPES}\n    {_TARGETS[f.target]}" if computed else ""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
g (float[batch, {seq}, {DIM}] x{sel}) => (float[batch, {seq}, {f.heads * f.vd}] y) {{{reads}
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
        "sizes": np.array([f.kd, f.kd, f.vd], np.int64),
        "w": rng.standard_normal((DIM, channels)) / 4,
        "gamma": rng.uniform(0.5, 1.5, channels),
        "beta": rng.standard_normal(channels) / 4,
        "factor": np.array(1 / size if f.scale == "Mul" else size),
        "attention_bias": rng.standard_normal((1, f.heads, SEQ, SEQ)),
    }
    if computed:
        sizes = {"n": f.heads, "p": part, "width": f.heads * f.vd, "minus": -1, "i0": 0, "i1": 1}
        inits |= {name: np.array([v], np.int64) for name, v in sizes.items()}
    else:
        inits["target"] = np.array([-1, SEQ, f.heads, part], np.int64)
        inits["merged"] = np.array([-1, SEQ, f.heads * f.vd], np.int64)
    cuts = np.array([0, f.kd, 2 * f.kd, part], np.int64)
    inits.update({f"s{i}": cuts[i : i + 1] for i in range(4)} | {"axis3": np.array([3])})
    return build_model(text, inits)


# what every generated block draws: heads, the key and value head sizes, how the parts
# are cut, the scale's op
_DRAWN = dict(
    heads=st.sampled_from([2, 4]),
    kd=st.sampled_from([4, 8]),
    vd=st.sampled_from([8, 16]),
    parts=st.sampled_from(["split", "slices"]),
    scale=st.sampled_from(["Mul", "Div"]),
)
flats = st.builds(Flat, **_DRAWN, bias=st.booleans())


def _feeds(batch: int, seq: int = SEQ, heads: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(batch)
    feeds = {"x": rng.standard_normal((batch, seq, DIM)).astype(np.float32)}
    return feeds | ({"sel": np.zeros(heads, np.float32)} if heads else {})


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


computed = st.builds(Flat, **_DRAWN, target=st.sampled_from(["shapes", "minus"]))


@SPELLINGS
@given(flat=computed)
def test_heads_split_by_a_target_computed_from_shapes_fuse_once(flat: Flat) -> None:
    """Batch and sequence dynamic, the head split's target read from ``x``'s shape: the
    attention fuses and computes what the block did at two sizes with ``B != S``."""
    model = flat_block(flat)
    fused = fuse_quiet(model)
    assert "Softmax" not in fused.ops, fused.misses_about("attention")
    assert fused.ops_among(("Attention", "MultiHeadAttention")) == ["MultiHeadAttention"]
    for batch, seq in ((1, 5), (3, 2)):
        run_both(model, fused.model, feeds=_feeds(batch, seq), **TOL)


def test_nothing_fused_from_a_computed_target_comes_out_as_it_went_in() -> None:
    model = flat_block(Flat(target="shapes"))
    out = optimize_quiet(model, target="onnxruntime", exclude=["attention"]).to_proto()
    assert not any("flat_head_split" in n.name for n in out.graph.node)
    run_both(model, out, feeds=_feeds(2, 3), **EXACT)


def test_a_head_count_the_graph_does_not_prove_stays() -> None:
    """The target's head count read from the length of another input (``Shape(sel)``):
    the heads' label says 2, but nothing proves it, so no rows are laid out, nothing
    fuses, and the model computes what it did bit for bit."""
    flat = Flat(target="unproven")
    model = inferred(flat_block(flat))
    heads = next(v for v in model.graph.value_info if v.name == "heads")
    heads.type.tensor_type.shape.dim[2].dim_value = flat.heads  # the label alone says so
    work, counter = ir.from_proto(model), itertools.count()
    assert "flat_head_split" not in canonical_form(work.graph, lambda h: f"{h}_{next(counter)}")
    fused = fuse_quiet(model)
    assert "MultiHeadAttention" not in fused.ops and "Softmax" in fused.ops
    assert not any("flat_head_split" in n.name for n in fused.model.graph.node)
    run_both(model, fused.model, feeds=_feeds(2, 3, heads=flat.heads), **EXACT)
