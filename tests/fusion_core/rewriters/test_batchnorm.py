"""``fold_batchnorm`` (conv_bn, dwconv_bn, gemm_bn) and ``pool_bn``."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import (
    assert_fusion,
    assert_no_fusion,
    bn_params,
    build_model,
    optimize_quiet,
)

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'
BN = "BatchNormalization <epsilon={eps!r}> ({src}, bn_scale, bn_bias, bn_mean, bn_var)"


def conv_bn(*, cin=4, cout=4, group=1, bias=True, eps=1e-5, op="Conv", seed=0):
    """x[1,cin,6,6] -> Conv/ConvTranspose (3x3) -> BN -> y, nodes named conv1 and bn1."""
    rng = np.random.default_rng(seed)
    if op == "Conv":
        weight = rng.standard_normal((cout, cin // group, 3, 3))
        attrs, size = "pads = [1, 1, 1, 1]", 6
    else:  # ConvTranspose weight is [C, M/group, k, k]
        weight = rng.standard_normal((cin, cout // group, 3, 3))
        attrs, size = "strides = [2, 2]", 13
    inits = {"w": weight, **bn_params(rng, cout)}
    inputs = "x, w"
    if bias:
        inits["cb"] = rng.standard_normal(cout)
        inputs += ", cb"
    text = f"""{HEADER}
    g (float[1, {cin}, 6, 6] x) => (float[1, {cout}, {size}, {size}] y) {{
        [conv1] c = {op} <group = {group}, {attrs}> ({inputs})
        [bn1] y = {BN.format(eps=eps, src="c")}
    }}"""
    return build_model(text, inits)


def gemm_bn(*, trans_b=0, bias=True, alpha=1.0, beta=1.0, bias_shape=(4,)):
    rng = np.random.default_rng(1)
    inits = {"w": rng.standard_normal((4, 5) if trans_b else (5, 4)), **bn_params(rng, 4)}
    inputs = "x, w"
    if bias:
        inits["c"] = rng.standard_normal(bias_shape)
        inputs += ", c"
    text = f"""{HEADER}
    g (float[3, 5] x) => (float[3, 4] y) {{
        h = Gemm <transB = {trans_b}, alpha = {alpha!r}, beta = {beta!r}> ({inputs})
        y = {BN.format(eps=1e-5, src="h")}
    }}"""
    return build_model(text, inits)


def pool_bn(*, positive=True, pads=(1, 1, 1, 1), indices=False):
    """Conv -> MaxPool (3x3, stride 2) -> BN; ``indices``: MaxPool's Indices is an output."""
    rng = np.random.default_rng(2)
    pool_out, extra = ("p, idx", ", int64[1, 4, 4, 4] idx") if indices else ("p", "")
    inits = {
        "w": rng.standard_normal((4, 3, 3, 3)),
        "cb": rng.standard_normal(4),
        **bn_params(rng, 4, positive=positive),
    }
    text = f"""{HEADER}
    g (float[1, 3, 8, 8] x) => (float[1, 4, 4, 4] y{extra}) {{
        c = Conv <pads = [1, 1, 1, 1]> (x, w, cb)
        {pool_out} = MaxPool <kernel_shape = [3, 3], strides = [2, 2], pads = {list(pads)}> (c)
        y = {BN.format(eps=1e-5, src="p")}
    }}"""
    return build_model(text, inits)


@pytest.mark.parametrize("eps", [1e-5, 1e-3, 0.1], ids=["eps1e-5", "eps1e-3", "eps0.1"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("group", [1, 2], ids=["group1", "group2"])
def test_conv_bn_folds_into_conv(group, bias, eps):
    model = conv_bn(group=group, bias=bias, eps=eps)
    assert_fusion(
        model, optimize_quiet(model), counts={"conv_bn": 1}, ops=["Conv"], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("cout", [4, 8], ids=["multiplier1", "multiplier2"])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_depthwise_conv_is_counted_as_dwconv_bn(bias, cout):
    model = conv_bn(cin=4, cout=cout, group=4, bias=bias, eps=1e-3)
    assert_fusion(
        model, optimize_quiet(model), counts={"dwconv_bn": 1}, ops=["Conv"], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
@pytest.mark.parametrize("group", [1, 2], ids=["group1", "group2"])
def test_conv_transpose_bn_folds(group, bias):
    model = conv_bn(cin=4, cout=6, group=group, bias=bias, op="ConvTranspose")
    assert_fusion(
        model,
        optimize_quiet(model),
        counts={"conv_bn": 1},
        ops=["ConvTranspose"],
        rtol=1e-5,
        atol=1e-5,
    )


@pytest.mark.parametrize(
    ("trans_b", "bias", "alpha", "beta", "bias_shape"),
    [
        (0, True, 1.0, 1.0, (4,)),
        (1, True, 1.0, 1.0, (4,)),
        (0, False, 1.0, 1.0, (4,)),
        (1, False, 0.5, 1.0, (4,)),
        (0, True, 0.5, 2.0, (4,)),
        (1, True, 1.5, -0.5, (4,)),
        (0, True, 1.0, 2.0, (3, 4)),
        (1, True, 0.5, 2.0, (1, 4)),
        (0, True, 1.0, 0.0, (4,)),
    ],
    ids=[
        "transB0",
        "transB1",
        "transB0-noC",
        "transB1-noC-alpha",
        "transB0-alpha-beta",
        "transB1-alpha-negbeta",
        "transB0-C_MxN-beta",
        "transB1-C_1xN-alpha-beta",
        "transB0-beta0",
    ],
)
def test_gemm_bn_folds_into_gemm(trans_b, bias, alpha, beta, bias_shape):
    model = gemm_bn(trans_b=trans_b, bias=bias, alpha=alpha, beta=beta, bias_shape=bias_shape)
    assert_fusion(
        model, optimize_quiet(model), counts={"gemm_bn": 1}, ops=["Gemm"], rtol=1e-5, atol=1e-5
    )


def test_matmul_with_constant_weight_and_bn_becomes_gemm():
    rng = np.random.default_rng(3)
    text = f"""{HEADER}
    g (float[3, 5] x) => (float[3, 4] y) {{
        h = MatMul (x, w)
        y = {BN.format(eps=1e-3, src="h")}
    }}"""
    model = build_model(text, {"w": rng.standard_normal((5, 4)), **bn_params(rng, 4)})
    assert_fusion(
        model, optimize_quiet(model), counts={"gemm_bn": 1}, ops=["Gemm"], rtol=1e-5, atol=1e-5
    )


@pytest.mark.parametrize("pads", [(1, 1, 1, 1), (0, 0, 1, 1)], ids=["pads1", "pads-asym"])
def test_pool_bn_moves_bn_before_maxpool(pads):
    model = pool_bn(pads=pads)
    assert_fusion(
        model,
        optimize_quiet(model),
        counts={"pool_bn": 1},
        ops=["Conv", "MaxPool"],
        rtol=1e-5,
        atol=1e-5,
    )


def test_conv_bn_with_zero_epsilon():
    # eps = 0 is legal; with a small variance, folding with eps = 1e-5 instead is 5% off.
    model = conv_bn(eps=0.0)
    var = next(t for t in model.graph.initializer if t.name == "bn_var")
    var.CopyFrom(onnx.numpy_helper.from_array(np.full(4, 1e-4, dtype=np.float32), "bn_var"))
    assert_fusion(
        model, optimize_quiet(model), counts={"conv_bn": 1}, ops=["Conv"], rtol=1e-5, atol=1e-5
    )


def test_provenance_names_the_original_nodes_and_removed_value():
    fused = optimize_quiet(conv_bn()).to_proto()
    (node,) = fused.graph.node
    props = {p.key: p.value for p in node.metadata_props}
    assert props["autofusion.pattern"] == "conv_bn"
    assert json.loads(props["autofusion.replaced_nodes"]) == ["conv1", "bn1"]
    assert json.loads(props["autofusion.replaced_values"]) == ["c"]


# ---------------------------------------------------------------------------------------
# Negative cases: no fusion, and the near miss says why.


def with_output(model, name):
    """``model`` with its value ``name`` also exposed as a graph output."""
    model.graph.output.append(
        onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [1, 4, 6, 6])
    )
    return model


def conv_bn_shared_weight():
    rng = np.random.default_rng(4)
    text = f"""{HEADER}
    g (float[1, 4, 6, 6] x) => (float[1, 4, 6, 6] y, float[1, 4, 6, 6] z) {{
        c = Conv <pads = [1, 1, 1, 1]> (x, w)
        y = {BN.format(eps=1e-5, src="c")}
        z = Conv <pads = [1, 1, 1, 1]> (x, w)
    }}"""
    return build_model(text, {"w": rng.standard_normal((4, 4, 3, 3)), **bn_params(rng, 4)})


def conv_bn_scale_is_input():
    rng = np.random.default_rng(5)
    inits = {"w": rng.standard_normal((4, 4, 3, 3)), **bn_params(rng, 4)}
    del inits["bn_scale"]
    text = f"""{HEADER}
    g (float[1, 4, 6, 6] x, float[4] bn_scale) => (float[1, 4, 6, 6] y) {{
        c = Conv <pads = [1, 1, 1, 1]> (x, w)
        y = {BN.format(eps=1e-5, src="c")}
    }}"""
    return build_model(text, inits)


@pytest.mark.parametrize(
    ("make", "patterns", "pattern", "reason", "ops"),
    [
        (
            lambda: with_output(conv_bn(), "c"),
            None,
            "conv_bn",
            "is a graph output",
            ["Conv", "BatchNormalization"],
        ),
        (
            conv_bn_shared_weight,
            None,
            "conv_bn",
            "consumer",
            ["Conv", "BatchNormalization", "Conv"],
        ),
        (conv_bn_scale_is_input, None, "conv_bn", "not a constant", ["Conv", "BatchNormalization"]),
        (conv_bn, ["dwconv_bn"], "dwconv_bn", "group", ["Conv", "BatchNormalization"]),
        (
            lambda: pool_bn(positive=False),
            None,
            "pool_bn",
            "the values of bn.in1",
            ["Conv", "MaxPool", "BatchNormalization"],
        ),
        (
            lambda: pool_bn(indices=True),
            None,
            "pool_bn",
            "pool.out1",
            ["Conv", "MaxPool", "BatchNormalization"],
        ),
    ],
    ids=[
        "conv-output-is-graph-output",
        "shared-weight",
        "bn-scale-is-graph-input",
        "dwconv-on-group1",
        "pool-bn-negative-gamma",
        "pool-bn-indices-are-graph-output",
    ],
)
def test_no_fusion_and_the_reason(make, patterns, pattern, reason, ops):
    model = make()
    result = optimize_quiet(model, patterns=patterns)
    assert result.counts == {}
    assert_no_fusion(model, result, pattern=pattern, reason=reason, ops=ops, rtol=1e-5, atol=1e-5)
