"""``skip_rms_norm`` (onnxruntime): a residual Add + RMS norm ->
com.microsoft.SkipSimplifiedLayerNormalization, in the decoders' pre-norm chain.

The graphs are a decoder's residual stream in small: ``[2, 5, 16]`` activations, a
MatMul standing for each attention or MLP branch, an RMS norm written out before each
(``Pow -> ReduceMean -> Add eps -> Sqrt -> Div | Reciprocal | Div(1, .) -> * gamma``,
the spellings the exporters use), gammas drawn away from 1. rms_norm fuses each norm
first; skip_rms_norm then takes the residual Adds: the first norm (of the embedding) has
no Add before it and stays a SimplifiedLayerNormalization. Tolerance: rtol = atol =
1e-5 (the kernels and the chains differ by a few 1e-7 on standard-normal inputs).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import (
    build_model,
    misses,
    op_sequence,
    optimize_quiet,
    run_both,
)
from tests.fusion_core.rewriters.test_layernorm import assert_valid_but_for, attributes, header

TOL = dict(rtol=1e-5, atol=1e-5)
SKIP = "com.microsoft::SkipSimplifiedLayerNormalization"
SIMPLIFIED = "SimplifiedLayerNormalization"


DIVISIONS = {  # the RMS division as each exporter spells it; norm_spelling makes one
    "div": ("[div{i}] q{i} = Div ({x}, s{i})", ""),
    "reciprocal": ("[rec{i}] r{i} = Reciprocal (s{i})\n[div{i}] q{i} = Mul ({x}, r{i})", ""),
    "div-one": ("[rec{i}] r{i} = Div (one, s{i})\n[div{i}] q{i} = Mul (r{i}, {x})", ""),
}


def rms(
    x: str, out: str, i: int, *, divide: str = "div", opset: int = 18, square: str = "pow"
) -> list[str]:
    """The written-out RMS norm of ``x`` into ``out`` (gamma ``g<i>``), node names ``*<i>``."""
    mean = "ReduceMean <keepdims = 1>" if opset >= 18 else "ReduceMean <axes = [-1], keepdims = 1>"
    axes = ", axes" if opset >= 18 else ""
    return [
        f"[pow{i}] sq{i} = Pow ({x}, exponent)"
        if square == "pow"
        else f"[pow{i}] sq{i} = Mul ({x}, {x})",
        f"[var{i}] v{i} = {mean} (sq{i}{axes})",
        f"[eps{i}] ve{i} = Add (v{i}, eps)",
        f"[sqrt{i}] s{i} = Sqrt (ve{i})",
        *DIVISIONS[divide][0].format(i=i, x=x).splitlines(),
        f"[scale{i}] {out} = Mul (q{i}, g{i})",
    ]


def decoder_model(
    body: list[str], *, inputs: str = "", outputs: str = "", opset: int = 18
) -> onnx.ModelProto:
    """x[2,5,16] (plus ``inputs``) -> ``body`` -> y[2,5,16] (plus ``outputs``); constants
    w0..w3 [16, 16], gammas g0..g3 [16] in [0.5, 2] with alternating signs."""
    rng = np.random.default_rng(7)
    inits = {"exponent": np.array(2.0), "eps": np.array(1e-6), "one": np.array(1.0)}
    if opset >= 18:
        inits["axes"] = np.array([-1], dtype=np.int64)
    for i in range(4):
        inits[f"w{i}"] = rng.standard_normal((16, 16)) / 4
        inits[f"g{i}"] = rng.uniform(0.5, 2.0, 16) * np.where(np.arange(16) % 2, 1, -1)
    text = f"""{header(opset)}
    g (float[2, 5, 16] x{inputs}) => (float[2, 5, 16] y{outputs}) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


def chain(divide: str = "div", layers: int = 2, square: str = "pow") -> list[str]:
    """Embedding norm, then per block: branch MatMul, residual Add, the next norm."""
    lines = rms("x", "n0", 0, divide=divide, square=square)
    stream = "x"
    for i in range(layers):
        lines += [f"b{i} = MatMul (n{i}, w{i})", f"[res{i}] h{i} = Add ({stream}, b{i})"]
        lines += rms(f"h{i}", f"n{i + 1}", i + 1, divide=divide, square=square)
        stream = f"h{i}"
    lines.append(f"y = MatMul (n{layers}, w{layers})")
    return lines


def unchecked_model(body: list[str], *, inputs: str, opset: int = 18) -> onnx.ModelProto:
    """``decoder_model`` without onnx.checker: ``body`` names onnxruntime's own
    SimplifiedLayerNormalization, which the checker rejects in the ONNX domain."""
    checked = decoder_model(["y = Identity (x)"], inputs=inputs, opset=opset)
    text = f"""{header(opset)}
    g (float[2, 5, 16] x{inputs}) => (float[2, 5, 16] y) {{
        {chr(10).join(body)}
    }}"""
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(checked.graph.initializer)
    return model


def fused_ops(result) -> list[str]:
    return op_sequence(result.to_proto())


@pytest.mark.parametrize("divide", DIVISIONS.keys())
def test_a_decoder_chain_becomes_one_simplified_and_skip_simplified_norms(divide):
    model = decoder_model(chain(divide))
    result = optimize_quiet(model, target="onnxruntime")
    rms_pattern = "rms_norm" + DIVISIONS[divide][1]
    # round 2: the first residual sum also feeds the next Add (pre-LN), which is
    # re-created reading input_skip_bias_sum; round 3 fuses that Add with the final norm
    assert result.counts == {rms_pattern: 3, "skip_rms_norm_pre_ln": 1, "skip_rms_norm": 1}
    fused = result.to_proto()
    expected = [SIMPLIFIED, "MatMul", SKIP, "MatMul", SKIP, "MatMul"]
    assert op_sequence(fused) == expected
    assert_valid_but_for(fused, SIMPLIFIED, 18)
    run_both(model, fused, **TOL)
    first, last = [n for n in fused.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert list(first.input) == ["x", "b0", "h0_rms_scale"]
    assert first.output[1:3] == ["", ""] and first.output[3] in last.input
    assert len(last.output) == 1
    assert attributes(first)["epsilon"] == pytest.approx(1e-6)


@pytest.mark.parametrize("divide", DIVISIONS.keys())
def test_the_square_as_mul_x_x_fuses_too(divide):
    model = decoder_model(chain(divide, square="mul"))
    result = optimize_quiet(model, target="onnxruntime")
    rms_pattern = "rms_norm" + DIVISIONS[divide][1]
    assert result.counts == {rms_pattern: 3, "skip_rms_norm_pre_ln": 1, "skip_rms_norm": 1}
    assert fused_ops(result) == [SIMPLIFIED, "MatMul", SKIP, "MatMul", SKIP, "MatMul"]
    run_both(model, result.to_proto(), **TOL)


def test_a_longer_chain_fuses_every_residual_add_over_two_rounds():
    model = decoder_model(chain("reciprocal", layers=3))
    result = optimize_quiet(model, target="onnxruntime")
    skips = {k: v for k, v in result.counts.items() if k.startswith("skip_rms_norm")}
    assert sum(skips.values()) == 3, result.counts
    assert any("chained" in k for k in skips), skips  # the second round's forms
    ops = fused_ops(result)
    assert ops.count(SKIP) == 3 and ops.count(SIMPLIFIED) == 1 and ops.count("Add") == 0
    run_both(model, result.to_proto(), **TOL)


def test_residual_add_and_simplified_layer_normalization_fuse_with_their_epsilon():
    body = [
        "h = Add (x, r)",
        "n = SimplifiedLayerNormalization <axis = -1, epsilon = 0.001> (h, g0)",
        "y = MatMul (n, w0)",
    ]
    model = unchecked_model(body, inputs=", float[2, 5, 16] r")
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts == {"skip_rms_norm": 1}
    fused = result.to_proto()
    assert op_sequence(fused) == [SKIP, "MatMul"]
    onnx.checker.check_model(fused, full_check=True)  # only a com.microsoft op is left
    (node,) = [n for n in fused.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    assert list(node.input) == ["x", "r", "g0"]
    assert attributes(node)["epsilon"] == pytest.approx(1e-3)
    run_both(model, fused, **TOL)


def test_rms_normalization_at_opset23_fuses_too():
    body = ["h = Add (x, r)", "n = RMSNormalization (h, g0)", "y = MatMul (n, w0)"]
    model = decoder_model(body, inputs=", float[2, 5, 16] r", opset=23)
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts == {"skip_rms_norm": 1}
    assert fused_ops(result) == [SKIP, "MatMul"]
    run_both(model, result.to_proto(), **TOL)


def test_the_generic_target_keeps_the_residual_add():
    model = decoder_model(chain("div"), opset=23)
    result = optimize_quiet(model, target="generic")
    assert result.counts == {"rms_norm": 3}
    assert fused_ops(result).count("Add") == 2 and SKIP not in fused_ops(result)
    run_both(model, result.to_proto(), **TOL)


def test_a_broadcast_residual_input_is_a_near_miss():
    # x[1, 5, 16] + r[2, 5, 16]: the kernel broadcasts only its skip, so r is the input
    # and x the skip; [2, 1, 16] fits neither and must not fuse
    body = [
        "h = Add (x, p)",
        "n = SimplifiedLayerNormalization (h, g0)",
        "y = MatMul (n, w0)",
    ]
    text_model = unchecked_model(body, inputs=", float[2, 1, 16] p")
    result = optimize_quiet(text_model, target="onnxruntime")
    assert "skip_rms_norm" not in result.counts
    reasons = misses(result, "skip_rms_norm")
    assert any("broadcasts only a skip" in r for r in reasons), reasons
    run_both(text_model, result.to_proto(), **TOL)


def test_a_norm_over_another_axis_is_a_near_miss():
    body = [
        "h = Add (x, r)",
        "n = SimplifiedLayerNormalization <axis = 1> (h, g0)",
        "y = MatMul (n, w0)",
    ]
    model = unchecked_model(body, inputs=", float[2, 5, 16] r")
    result = optimize_quiet(model, target="onnxruntime")
    assert "skip_rms_norm" not in result.counts
    reasons = misses(result, "skip_rms_norm")
    assert any("not over the last axis" in r for r in reasons), reasons


def test_provenance_names_the_residual_add():
    model = decoder_model(chain("div", layers=1))
    fused = optimize_quiet(model, target="onnxruntime").to_proto()
    (node,) = [n for n in fused.graph.node if n.op_type == "SkipSimplifiedLayerNormalization"]
    props = {p.key: p.value for p in node.metadata_props}
    assert props["autofusion.pattern"] == "skip_rms_norm"
    assert "res0" in json.loads(props["autofusion.replaced_nodes"])


def test_the_default_cpu_profile_leaves_it_out_as_a_predicted_loss():
    # onnxruntime's CPU SkipSimplifiedLayerNormalization is up to 2x slower than the pair
    # from 16 rows on (fusion_core/target_profiles/cpu.yaml): the default finds every
    # place and says why it kept the pair
    model = decoder_model(chain("div"))
    result = optimize_quiet(model, target="onnxruntime", target_profile="cpu")
    assert result.counts == {"rms_norm": 3}
    losses = {
        m.nodes[0]
        for m in result.near_misses
        if m.pattern.startswith("skip_rms_norm") and "the cost model predicts a loss" in m.reason
    }
    assert losses == {"res0", "res1"}, result.near_misses  # each residual Add
    assert fused_ops(result).count("Add") == 2
    run_both(model, result.to_proto(), **TOL)
