"""``fused_region``: a user pattern wraps its match into a model-local ONNX function."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import (
    assert_fusion,
    assert_no_fusion,
    build_model,
    optimize_quiet,
)

HEADER = '<ir_version: 8, opset_import: ["" : 17]>'

CONV_RELU = {
    "name": "test.conv_relu",
    "targets": ["generic", "onnxruntime"],
    "nodes": [
        {"id": "conv", "op": "Conv"},
        {"id": "act", "op": "Relu", "inputs": {0: "conv"}},
    ],
    "rewriter": {"name": "fused_region", "params": {"domain": "ai.test", "op_type": "ConvRelu"}},
}
MATMUL_ADD_RELU = {  # no op_type: it defaults to the pattern name in CamelCase
    "name": "test.matmul_add_relu",
    "nodes": [
        {"id": "mm", "op": "MatMul"},
        {"id": "add", "op": "Add", "inputs": {0: "mm"}},
        {"id": "act", "op": "Relu", "inputs": {0: "add"}},
    ],
    "rewriter": {"name": "fused_region", "params": {"domain": "ai.test"}},
}


def optimize_with(model, pattern, target="generic"):
    return optimize_quiet(
        model, target=target, patterns=[pattern["name"]], extra_patterns=[pattern]
    )


def conv_relus(pads: list[list[int]], *, expose: str = "", seed=0):
    """A chain of Conv (3x3, given pads) + Relu blocks on x[1,4,8,8], one per ``pads``."""
    rng = np.random.default_rng(seed)
    lines, inits, current, size = [], {}, "x", 8
    for k, p in enumerate(pads):
        inits[f"w{k}"] = rng.standard_normal((4, 4, 3, 3))
        inits[f"b{k}"] = rng.standard_normal(4)
        out = "y" if k == len(pads) - 1 else f"r{k}"
        lines.append(f"c{k} = Conv <pads = {p}> ({current}, w{k}, b{k})")
        lines.append(f"{out} = Relu (c{k})")
        current, size = out, size + p[0] + p[2] - 2
    extra = f", float[1, 4, {size}, {size}] {expose}" if expose else ""  # one block only
    body = "\n        ".join(lines)
    text = f"""{HEADER}
    g (float[1, 4, 8, 8] x) => (float[1, 4, {size}, {size}] y{extra}) {{
        {body}
    }}"""
    return build_model(text, inits)


def functions(model: onnx.ModelProto) -> list[tuple[str, str, str]]:
    return sorted((f.domain, f.name, f.overload) for f in model.functions)


@pytest.mark.parametrize("target", ["generic", "onnxruntime"])
def test_conv_relu_becomes_a_function_call(target):
    model = conv_relus([[1, 1, 1, 1]])
    result = optimize_with(model, CONV_RELU, target)
    fused = assert_fusion(
        model,
        result,
        counts={"test.conv_relu": 1},
        ops=["ai.test::ConvRelu"],
        rtol=1e-5,
        atol=1e-5,
    )
    assert functions(fused) == [("ai.test", "ConvRelu", "")]
    (call,) = fused.graph.node
    assert (call.domain, call.op_type) == ("ai.test", "ConvRelu")
    assert list(call.input) == ["x", "w0", "b0"]
    (function,) = fused.functions
    assert [n.op_type for n in function.node] == ["Conv", "Relu"]
    assert "ai.test" in {o.domain for o in fused.opset_import}


def test_identical_regions_share_one_function():
    model = conv_relus([[1, 1, 1, 1]] * 3)
    result = optimize_with(model, CONV_RELU)
    fused = assert_fusion(
        model,
        result,
        counts={"test.conv_relu": 3},
        ops=["ai.test::ConvRelu"] * 3,
        rtol=1e-5,
        atol=1e-5,
    )
    assert functions(fused) == [("ai.test", "ConvRelu", "")]


def test_different_regions_get_distinct_overloads():
    model = conv_relus([[1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1]])
    result = optimize_with(model, CONV_RELU)
    fused = assert_fusion(
        model,
        result,
        counts={"test.conv_relu": 3},
        ops=["ai.test::ConvRelu"] * 3,
        rtol=1e-5,
        atol=1e-5,
    )
    overloads = [f[2] for f in functions(fused)]
    assert len(overloads) == 2 and len(set(overloads)) == 2
    calls = [n.overload for n in fused.graph.node]
    assert calls[0] == calls[2] != calls[1]


@pytest.mark.parametrize("bias_shape", [(4,), (3, 4)], ids=["bias-N", "bias-MxN"])
def test_matmul_add_relu_region_with_default_op_type(bias_shape):
    rng = np.random.default_rng(1)
    text = f"""{HEADER}
    g (float[3, 5] x) => (float[3, 4] y) {{
        h = MatMul (x, w)
        s = Add (h, b)
        y = Relu (s)
    }}"""
    model = build_model(
        text, {"w": rng.standard_normal((5, 4)), "b": rng.standard_normal(bias_shape)}
    )
    result = optimize_with(model, MATMUL_ADD_RELU, "onnxruntime")
    fused = assert_fusion(
        model,
        result,
        counts={"test.matmul_add_relu": 1},
        ops=["ai.test::MatmulAddRelu"],
        rtol=1e-5,
        atol=1e-5,
    )
    assert functions(fused) == [("ai.test", "MatmulAddRelu", "")]


# ---------------------------------------------------------------------------------------
# Negative cases.


def test_region_whose_inner_value_is_a_graph_output_does_not_fuse():
    model = conv_relus([[1, 1, 1, 1]], expose="c0")
    result = optimize_with(model, CONV_RELU)
    assert result.counts == {}
    fused = assert_no_fusion(
        model,
        result,
        pattern="test.conv_relu",
        reason="is a graph output",
        ops=["Conv", "Relu"],
        rtol=1e-5,
        atol=1e-5,
    )
    assert functions(fused) == []


MATMUL_RESHAPE_RELU = {
    "name": "test.matmul_reshape_relu",
    "nodes": [
        {"id": "mm", "op": "MatMul"},
        {"id": "reshape", "op": "Reshape", "inputs": {0: "mm", 1: "$shape"}},
        {"id": "act", "op": "Relu", "inputs": {0: "reshape"}},
    ],
    "rewriter": {"name": "fused_region", "params": {"domain": "ai.test"}},
}


def reshaped_by_its_own_shape(*, expose_shape: bool) -> onnx.ModelProto:
    """MatMul, Reshape to ``[Size / 32, 32]`` with the Size read from the MatMul's
    output (outside the match, from inside it), Relu; ``expose_shape`` makes that
    Size a graph output too."""
    extra = ", int64 n" if expose_shape else ""
    text = f"""{HEADER}
    g (float[batch, 4, 8] x) => (float[batch, 32] y{extra}) {{
        m = MatMul (x, w)
        n = Size (m)
        rows = Div (n, width)
        lead = Unsqueeze (rows, axis)
        s = Concat <axis = 0> (lead, rest)
        r = Reshape (m, s)
        y = Relu (r)
    }}"""
    inits = {
        "w": np.random.default_rng(0).standard_normal((8, 8)),
        "width": np.array(32),
        "axis": np.array([0]),
        "rest": np.array([32]),
    }
    return build_model(text, inits)


def test_a_shape_read_that_feeds_the_region_is_no_escape_but_the_region_needs_it():
    """The Shape reads a value inside the match and feeds only the match, so the
    matcher sees no escape; but the function the rewriter builds would take the shape
    as an input, computed from a value the rewrite removes: a rewriter refusal."""
    model = reshaped_by_its_own_shape(expose_shape=False)
    result = optimize_with(model, MATMUL_RESHAPE_RELU)
    assert result.counts == {}
    (miss,) = [m for m in result.near_misses if m.pattern == MATMUL_RESHAPE_RELU["name"]]
    assert "computed from the shape of a value it removes" in miss.reason, miss
    onnx.checker.check_model(result.to_proto(), full_check=True)


def test_a_shape_read_that_is_also_a_graph_output_escapes():
    model = reshaped_by_its_own_shape(expose_shape=True)
    result = optimize_with(model, MATMUL_RESHAPE_RELU)
    assert result.counts == {}
    (miss,) = [m for m in result.near_misses if m.pattern == MATMUL_RESHAPE_RELU["name"]]
    assert miss.kind == "escape" and "is also used by Size" in miss.reason, miss
