"""``fuse_activation``: conv_bn_relu, conv_bn_add_relu, conv_add_relu, conv_activation and
gemm_activation (com.microsoft FusedConv / FusedGemm on onnxruntime)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import (
    assert_fusion,
    assert_no_fusion,
    bn_params,
    build_model,
    misses,
    op_sequence,
    optimize_quiet,
    run_both,
)

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
HEADER_OPSET10 = '<ir_version: 5, opset_import: ["" : 10]>'  # Clip bounds are attributes
FUSED_CONV = ["com.microsoft::FusedConv"]
BN = "BatchNormalization <epsilon = 0.001> (c, bn_scale, bn_bias, bn_mean, bn_var)"


def conv_model(body, *, extra_inputs="", inits=None, header=HEADER, seed=0):
    """x[1,4,6,6] -> c = Conv(x, w, cb) (3x3, pads 1) -> ``body`` -> y[1,4,6,6]."""
    rng = np.random.default_rng(seed)
    arrays = {"w": rng.standard_normal((4, 4, 3, 3)), "cb": rng.standard_normal(4)}
    arrays |= bn_params(rng, 4)
    text = f"""{header}
    g (float[1, 4, 6, 6] x{extra_inputs}) => (float[1, 4, 6, 6] y) {{
        c = Conv <pads = [1, 1, 1, 1]> (x, w, cb)
        {body}
    }}"""
    return build_model(text, arrays | (inits or {}))


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def the_node(fused: onnx.ModelProto) -> onnx.NodeProto:
    (node,) = fused.graph.node
    return node


def test_conv_bn_relu_becomes_fused_conv():
    model = conv_model(f"n = {BN}\n y = Relu (n)")
    result = optimize_quiet(model, target="onnxruntime")
    fused = assert_fusion(
        model, result, counts={"conv_bn_relu": 1}, ops=FUSED_CONV, rtol=1e-5, atol=1e-5
    )
    node = the_node(fused)
    assert attributes(node)["activation"] == b"Relu"
    assert len(node.input) == 3


RESIDUAL_BODIES = {
    "bn-first": "s = Add (n, x)",
    "residual-first": "s = Add (x, n)",
    "sum": "s = Sum (n, x)",
}


@pytest.mark.parametrize("body", RESIDUAL_BODIES.values(), ids=RESIDUAL_BODIES.keys())
def test_conv_bn_add_relu_takes_the_residual_as_z(body):
    model = conv_model(f"n = {BN}\n {body}\n y = Relu (s)")
    result = optimize_quiet(model, target="onnxruntime")
    fused = assert_fusion(
        model, result, counts={"conv_bn_add_relu": 1}, ops=FUSED_CONV, rtol=1e-5, atol=1e-5
    )
    node = the_node(fused)
    assert node.input[0] == "x" and node.input[3] == "x"
    assert attributes(node)["activation"] == b"Relu"


@pytest.mark.parametrize(
    "add", ["Add (c, r)", "Add (r, c)", "Sum (c, r)"], ids=["add", "residual-first", "sum"]
)
def test_conv_add_relu_takes_the_residual_as_z(add):
    model = conv_model(f"s = {add}\n y = Relu (s)", extra_inputs=", float[1, 4, 6, 6] r")
    result = optimize_quiet(model, target="onnxruntime")
    fused = assert_fusion(
        model, result, counts={"conv_add_relu": 1}, ops=FUSED_CONV, rtol=1e-5, atol=1e-5
    )
    assert list(the_node(fused).input) == ["x", "w", "cb", "r"]


GENERIC_CASES = {
    "conv_bn": ("y = " + BN, ["Conv"]),
    "conv_bn_relu": (f"n = {BN}\n y = Relu (n)", ["Conv", "Relu"]),
    "conv_bn_add_relu": (f"n = {BN}\n s = Add (n, x)\n y = Relu (s)", ["Conv", "Add", "Relu"]),
}


@pytest.mark.parametrize(
    ("pattern", "body", "ops"),
    [(name, *case) for name, case in GENERIC_CASES.items()],
    ids=GENERIC_CASES.keys(),
)
def test_generic_target_folds_bn_and_keeps_the_rest(pattern, body, ops):
    model = conv_model(body)
    result = optimize_quiet(model, target="generic")
    assert_fusion(model, result, counts={pattern: 1}, ops=ops, rtol=1e-5, atol=1e-5)


ACTIVATIONS = {
    "Relu": ("Relu (c)", {}, None),
    "Clip": ("Clip (c, lo, hi)", {"lo": np.float32(-0.5), "hi": np.float32(0.7)}, [-0.5, 0.7]),
    "Clip-min-only": ("Clip (c, lo)", {"lo": np.float32(0.1)}, None),
    "LeakyRelu": ("LeakyRelu <alpha = 0.2> (c)", {}, [0.2]),
    "LeakyRelu-default": ("LeakyRelu (c)", {}, [0.01]),
    "Sigmoid": ("Sigmoid (c)", {}, None),
    "HardSigmoid": ("HardSigmoid <alpha = 0.3, beta = 0.6> (c)", {}, [0.3, 0.6]),
    "Tanh": ("Tanh (c)", {}, None),
}


@pytest.mark.parametrize(("call", "inits", "params"), ACTIVATIONS.values(), ids=ACTIVATIONS.keys())
def test_conv_activation_becomes_fused_conv(call, inits, params):
    model = conv_model(f"y = {call}", inits=inits)
    result = optimize_quiet(model, target="onnxruntime")
    fused = assert_fusion(
        model, result, counts={"conv_activation": 1}, ops=FUSED_CONV, rtol=1e-5, atol=1e-5
    )
    attrs = attributes(the_node(fused))
    assert attrs["activation"] == call.split()[0].encode()
    if params is not None:
        np.testing.assert_allclose(attrs["activation_params"], params, rtol=1e-6, atol=0)


F32 = np.finfo(np.float32)


@pytest.mark.parametrize(
    ("attrs", "params"),
    [
        ("min = -0.5, max = 0.7", [-0.5, 0.7]),
        ("max = 0.7", [F32.min, 0.7]),
        ("min = -0.5", [-0.5, F32.max]),
    ],
    ids=["min-max", "max-only", "min-only"],
)
def test_opset10_clip_with_bounds_as_attributes(attrs, params):
    model = conv_model(f"y = Clip <{attrs}> (c)", header=HEADER_OPSET10)
    result = optimize_quiet(model, target="onnxruntime")
    fused = assert_fusion(
        model, result, counts={"conv_activation": 1}, ops=FUSED_CONV, rtol=1e-5, atol=1e-5
    )
    got = attributes(the_node(fused))["activation_params"]
    np.testing.assert_allclose(got, params, rtol=1e-6, atol=0)


def gemm_model(call: str, gemm_attrs: str = "", seed=1):
    rng = np.random.default_rng(seed)
    text = f"""{HEADER}
    g (float[3, 5] x) => (float[3, 4] y) {{
        h = Gemm {gemm_attrs} (x, w, b)
        y = {call}
    }}"""
    w = rng.standard_normal((4, 5) if "transB" in gemm_attrs else (5, 4))
    return build_model(text, {"w": w, "b": rng.standard_normal(4)})


GEMM_ACTIVATIONS = {
    "Relu": ("Relu (h)", ""),
    "LeakyRelu": ("LeakyRelu <alpha = 0.2> (h)", ""),
    "Sigmoid": ("Sigmoid (h)", ""),
    "HardSigmoid": ("HardSigmoid <alpha = 0.3, beta = 0.6> (h)", ""),
    "Tanh": ("Tanh (h)", ""),
    "Relu-alpha-beta-transB": ("Relu (h)", "<alpha = 0.5, beta = 2.0, transB = 1>"),
}


@pytest.mark.parametrize(("call", "gemm_attrs"), GEMM_ACTIVATIONS.values(), ids=GEMM_ACTIVATIONS)
def test_gemm_activation_becomes_fused_gemm(call, gemm_attrs):
    model = gemm_model(call, gemm_attrs)
    result = optimize_quiet(model, target="onnxruntime")
    fused = assert_fusion(
        model,
        result,
        counts={"gemm_activation": 1},
        ops=["com.microsoft::FusedGemm"],
        rtol=1e-5,
        atol=1e-5,
    )
    assert attributes(the_node(fused))["activation"] == call.split()[0].encode()


# ---------------------------------------------------------------------------------------
# Negative cases.


def test_generic_target_does_not_use_conv_activation():
    model = conv_model("y = Relu (c)")
    result = optimize_quiet(model, target="generic", patterns=["conv_activation"])
    assert result.patterns_used == []
    assert result.counts == {}
    assert misses(result, "conv_activation") == []
    fused = result.to_proto()
    assert op_sequence(fused) == ["Conv", "Relu"]
    onnx.checker.check_model(fused, full_check=True)
    run_both(model, fused, rtol=1e-5, atol=1e-5)


def gemm_output_exposed():
    model = gemm_model("Relu (h)")
    model.graph.output.append(
        onnx.helper.make_tensor_value_info("h", onnx.TensorProto.FLOAT, [3, 4])
    )
    return model


BROADCAST_R = ", float[1, 4, 1, 1] r"
NEGATIVE = {
    "conv-add-relu-residual-broadcasts": (
        lambda: conv_model("s = Add (c, r)\n y = Relu (s)", extra_inputs=BROADCAST_R),
        "conv_add_relu",
        "has shape",
        {},
        ["Conv", "Add", "Relu"],
    ),
    "conv-bn-add-relu-residual-broadcasts": (
        lambda: conv_model(f"n = {BN}\n s = Add (n, r)\n y = Relu (s)", extra_inputs=BROADCAST_R),
        # The BN folds on its own; near misses are those of the last round, where the
        # folded Conv + Add + Relu is a conv_add_relu candidate.
        "conv_add_relu",
        "has shape",
        {"conv_bn": 1},
        ["Conv", "Add", "Relu"],
    ),
    "clip-bound-is-graph-input": (
        lambda: conv_model("y = Clip (c, lo)", extra_inputs=", float lo"),
        "conv_activation",
        "not a constant",
        {},
        ["Conv", "Clip"],
    ),
    "gemm-output-is-graph-output": (
        gemm_output_exposed,
        "gemm_activation",
        "is a graph output",
        {},
        ["Gemm", "Relu"],
    ),
}


@pytest.mark.parametrize(
    ("make", "pattern", "reason", "counts", "ops"), NEGATIVE.values(), ids=NEGATIVE.keys()
)
def test_no_fusion_and_the_reason(make, pattern, reason, counts, ops):
    model = make()
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts == counts
    assert_no_fusion(model, result, pattern=pattern, reason=reason, ops=ops, rtol=1e-5, atol=1e-5)
