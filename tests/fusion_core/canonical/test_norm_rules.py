"""The rules ``norm_spelling`` and ``transpose_before_rotary`` on small graphs: what
they rewrite, what they leave, that a second run changes nothing, that the parts no
fusion took are written back as they were, and that a fusion's provenance names the
input graph's nodes.

Values: the rewrites that only re-spell (``Add(x, Neg(m))`` as ``Sub``, ``Mul(d, d)`` as
``Pow(d, 2)``, ``Div(1, s)`` as ``Reciprocal``, ``+ 0``, the rotary's Transpose moved)
compute the same bits (rtol = atol = 0); ``d / s`` as ``d * (1 / s)``, a mean for
``ReduceSum / N`` and ``1 / sqrt(u)`` for ``u ** -0.5`` round differently in the last bit
(rtol 1e-6, atol 1e-7 on values of order 1). The generated spellings of whole blocks
are test_norm_spellings.py's.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from autofusion.fusion_core.canonical import MARK, canonical_form, undo_unused
from autofusion.fusion_core.testing import (
    build_model,
    canonical_twice,
    op_sequence,
    optimize_quiet,
    run_both,
)

EXACT = dict(rtol=0, atol=0)
LAST_BIT = dict(rtol=1e-6, atol=1e-7)
CONSTANTS = {
    "two": np.array(2.0),
    "half": np.array(-0.5),
    "one": np.array(1.0),
    "eps": np.array(1e-6),
    "n16": np.array(16.0),
    "last": np.array([-1], np.int64),
    "gamma": np.linspace(0.5, 1.5, 16),
}


def _model(body: list[str], opset: int = 18, shape: str = "2, 5, 16") -> onnx.ModelProto:
    text = f"""<ir_version: 8, opset_import: ["" : {opset}]>
    g (float[{shape}] x) => (float[{shape}] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, CONSTANTS)


def _restored(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict]:
    """The canonical form of ``model`` and then ``undo_unused``: (the graph, undone)."""
    work = ir.from_proto(onnx.shape_inference.infer_shapes(model, strict_mode=True))
    counter = itertools.count()
    canonical_form(work.graph, lambda hint: f"{hint}__{next(counter)}")
    undone = undo_unused(work.graph)
    return ir.to_proto(work), dict(+undone)


# Every part in its other spelling: a LayerNorm centered by Add(Neg), both means by
# ReduceSum, the square as Mul(d, d), no epsilon, the inverse root as Pow(u, -0.5).
EVERY_PART = [
    "[sum1] s1 = ReduceSum <keepdims = 1> (x, last)",
    "[mean1] m = Div (s1, n16)",
    "[neg1] nm = Neg (m)",
    "[add1] d = Add (nm, x)",
    "[sq1] q = Mul (d, d)",
    "[sum2] s2 = ReduceSum <keepdims = 1> (q, last)",
    "[var1] v = Div (s2, n16)",
    "[pow1] r = Pow (v, half)",
    "[mul1] n = Mul (r, d)",
    "y = Mul (n, gamma)",
]


def test_every_part_of_a_layer_norm_is_written_in_the_patterns_spelling() -> None:
    model = _model(EVERY_PART)
    canonical, done, again = canonical_twice(model)[:3]
    assert done == {"norm_spelling": 6} and again == 0
    assert op_sequence(canonical) == [
        "ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul",
    ]  # fmt: skip
    run_both(model, canonical, **LAST_BIT)


def test_the_parts_no_fusion_took_are_written_back_as_they_were() -> None:
    model = _model(EVERY_PART)
    restored, undone = _restored(model)
    assert undone == {"norm_spelling": 6}
    assert op_sequence(restored) == op_sequence(model)
    assert [n.name for n in restored.graph.node] == [n.name for n in model.graph.node]
    assert [n.input for n in restored.graph.node] == [n.input for n in model.graph.node]
    assert not any(p.key == MARK for n in restored.graph.node for p in n.metadata_props)
    run_both(model, restored, **EXACT)


# nGPT's L2 norm as TorchScript writes it: a sum of squares, not a mean, and rsqrt as
# Div(1, Sqrt); no weight of its own
L2_NORM = [
    "[sq1] q = Pow (x, two)",
    "[sum1] s = ReduceSum <keepdims = 1> (q, last)",
    "[eps1] u = Add (s, eps)",
    "[root1] r = Sqrt (u)",
    "[rec1] i = Div (one, r)",
    "[mul1] y = Mul (x, i)",
]


def test_an_l2_norm_is_an_rms_norm_of_a_smaller_epsilon_times_a_constant_gamma() -> None:
    """``x * rsqrt(sum(x^2) + eps) == N^-1/2 * x * rsqrt(mean(x^2) + eps / N)``."""
    model = _model(L2_NORM)
    canonical, done, again = canonical_twice(model)[:3]
    assert done == {"norm_spelling": 2} and again == 0  # the L2 reading, Div(1, .)
    assert op_sequence(canonical) == [
        "Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul",
    ]  # fmt: skip
    run_both(model, canonical, rtol=1e-5, atol=1e-6)
    fused = optimize_quiet(model, target="onnxruntime")
    assert fused.counts == {"rms_norm": 1}
    run_both(model, fused.to_proto(), rtol=1e-5, atol=1e-6)


def test_an_l2_norm_nothing_fused_is_written_back_as_it_was() -> None:
    model = _model(L2_NORM)
    restored, undone = _restored(model)
    assert undone == {"norm_spelling": 2}  # the mean (with its epsilon and scale), Div(1, .)
    assert op_sequence(restored) == op_sequence(model)
    assert [n.name for n in restored.graph.node] == [n.name for n in model.graph.node]
    assert [n.input for n in restored.graph.node] == [n.input for n in model.graph.node]
    run_both(model, restored, **EXACT)


def test_a_norm_nothing_fuses_comes_out_of_the_pipeline_as_it_went_in() -> None:
    """An RMS norm on the generic target below opset 23: no op to fuse into."""
    body = ["[sq1] q = Mul (x, x)", "[var1] v = ReduceMean <keepdims = 1> (q, last)"]
    body += ["[root1] s = Sqrt (v)", "[div1] n = Div (x, s)", "y = Mul (n, gamma)"]
    model = _model(body)
    result = optimize_quiet(model, target="generic")
    assert result.counts == {}
    assert op_sequence(result.to_proto()) == op_sequence(model)
    reasons = [m.reason for m in result.near_misses if m.pattern == "rms_norm"]
    assert any("RMSNormalization needs opset 23" in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("inverse", "exact"),
    [
        (["[root1] s = Sqrt (u)", "[div1] n = Div (x, s)"], False),
        (["[root1] s = Sqrt (u)", "[rec1] r = Div (one, s)", "[div1] n = Mul (x, r)"], True),
        (["[pow1] r = Pow (u, half)", "[div1] n = Mul (r, x)"], False),
    ],
    ids=["div", "div-one", "pow"],
)
def test_each_inverse_root_becomes_a_reciprocal_of_the_sqrt(inverse, exact) -> None:
    body = ["[sq1] q = Pow (x, two)", "[var1] v = ReduceMean <keepdims = 1> (q, last)"]
    body += ["[eps1] u = Add (eps, v)", *inverse, "y = Mul (gamma, n)"]
    model = _model(body)
    canonical, done, again = canonical_twice(model)[:3]
    assert done == {"norm_spelling": 1} and again == 0
    assert op_sequence(canonical) == [
        "Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul",
    ]  # fmt: skip
    run_both(model, canonical, **(EXACT if exact else LAST_BIT))


def test_a_norm_without_epsilon_fuses_with_epsilon_zero_and_names_its_nodes() -> None:
    """Helium's dynamo export: ``x * Reciprocal(Sqrt(ReduceMean(x ** 2)))``."""
    body = ["[sq1] q = Pow (x, two)", "[var1] v = ReduceMean <keepdims = 1> (q, last)"]
    body += ["[root1] s = Sqrt (v)", "[rec1] r = Reciprocal (s)", "[div1] n = Mul (x, r)"]
    model = _model([*body, "[scale1] y = Mul (gamma, n)"])
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts == {"rms_norm": 1}
    fused = result.to_proto()
    (norm,) = fused.graph.node
    assert norm.op_type == "SimplifiedLayerNormalization"
    assert [a.f for a in norm.attribute if a.name == "epsilon"] == [0.0]
    props = {p.key: p.value for p in norm.metadata_props}
    replaced = json.loads(props["autofusion.replaced_nodes"])
    assert replaced == ["sq1", "var1", "root1", "rec1", "div1", "scale1"]
    run_both(model, fused, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    "body",
    [
        # the square of another value than the one normalized
        ["q = Pow (z, two)", "v = ReduceMean <keepdims = 1> (q, last)", "r = Pow (v, half)",
         "y = Mul (x, r)"],
        # a sum divided by more than the elements it adds is no mean
        ["q = Mul (x, x)", "s2 = ReduceSum <keepdims = 1> (q, last)", "v = Div (s2, two)",
         "r = Pow (v, half)", "y = Mul (x, r)"],
        # the root read twice: rewriting it would change what the other reader sees
        ["q = Mul (x, x)", "v = ReduceMean <keepdims = 1> (q, last)", "r = Pow (v, half)",
         "n = Mul (x, r)", "y = Add (n, r)"],
        # a power other than the inverse square root
        ["q = Mul (x, x)", "v = ReduceMean <keepdims = 1> (q, last)", "r = Pow (v, two)",
         "y = Mul (x, r)"],
    ],
    ids=["other-square", "not-a-mean", "root-read-twice", "not-a-root"],
)  # fmt: skip
def test_what_is_no_norm_stays(body) -> None:
    model = _model(["z = Neg (x)", *body])
    assert canonical_twice(model)[1] == {}


# ---------------------------------------------------------------------------------------
# transpose_before_rotary


def _rotary_model(axis: int = -1) -> onnx.ModelProto:
    """Gemma-4's rotary on [B, S, N, H] heads, then the head Transpose; ``axis``: the
    axis the halves are sliced from and concatenated on."""
    text = f"""<ir_version: 8, opset_import: ["" : 18]>
    g (float[2, 5, 4, 8] x, float[1, 5, 8] c, float[1, 5, 8] s) => (float[2, 4, 5, 8] y) {{
        cos = Unsqueeze (c, heads_axis)
        sin = Unsqueeze (s, heads_axis)
        lo = Slice (x, zero, four, axis)
        hi = Slice (x, four, big, axis)
        nh = Neg (hi)
        rot = Concat <axis = {axis}> (nh, lo)
        a = Mul (x, cos)
        b = Mul (rot, sin)
        r = Add (a, b)
        y = Transpose <perm = [0, 2, 1, 3]> (r)
    }}"""
    half = 4 if axis == -1 else 2
    ints = {"zero": [0], "four": [half], "big": [2**62], "axis": [axis], "heads_axis": [2]}
    return build_model(text, {k: np.array(v, np.int64) for k, v in ints.items()})


def test_a_rotary_of_heads_before_their_transpose_rotates_the_transposed_heads() -> None:
    model = _rotary_model()
    canonical, done, again = canonical_twice(model)[:3]
    assert done == {"transpose_before_rotary": 1} and again == 0
    ops = op_sequence(canonical)
    assert ops.index("Transpose") < ops.index("Add") and ops.count("Transpose") == 1
    unsqueezed = [n for n in canonical.graph.node if n.op_type == "Unsqueeze"]
    axes = {i.name: onnx.numpy_helper.to_array(i) for i in canonical.graph.initializer}
    assert [axes[n.input[1]].tolist() for n in unsqueezed] == [[1], [1]]
    rng = np.random.default_rng(0)
    feeds = {k: rng.standard_normal(d).astype(np.float32)
             for k, d in (("x", (2, 5, 4, 8)), ("c", (1, 5, 8)), ("s", (1, 5, 8)))}  # fmt: skip
    run_both(model, canonical, feeds=feeds, **EXACT)


def test_a_rotation_of_another_axis_than_the_last_stays() -> None:
    assert canonical_twice(_rotary_model(axis=2))[1] == {}
