"""``matmul_add_to_gemm`` (pattern matmul_add): MatMul of 2-D tensors + Add -> Gemm."""

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


def matmul_add(
    bias_shape, *, bias_first=False, x_shape=(3, 5), bias_is_input=False, tail="", seed=0
):
    """y = Add(MatMul(x, w), b) [+ tail], with w [5, 4] constant and b of ``bias_shape``."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.standard_normal((5, 4))}
    extra = ""
    if bias_is_input:
        extra = f", float{list(bias_shape)} b"
    else:
        inits["b"] = rng.standard_normal(bias_shape)
    out_shape = list(np.broadcast_shapes(x_shape[:-1] + (4,), bias_shape))
    args = "b, h" if bias_first else "h, b"
    last = "s" if tail else "y"
    text = f"""{HEADER}
    g (float{list(x_shape)} x{extra}) => (float{out_shape} y) {{
        h = MatMul (x, w)
        {last} = Add ({args})
        {tail}
    }}"""
    return build_model(text, inits)


CASES = {
    "bias-N": dict(bias_shape=(4,)),
    "bias-MxN": dict(bias_shape=(3, 4)),
    "bias-1xN": dict(bias_shape=(1, 4)),
    "bias-Mx1": dict(bias_shape=(3, 1)),
    "bias-scalar": dict(bias_shape=()),
    "bias-first": dict(bias_shape=(4,), bias_first=True),
    "bias-is-graph-input": dict(bias_shape=(4,), bias_is_input=True),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("target", ["generic", "onnxruntime"])
def test_matmul_add_becomes_gemm(target, case):
    model = matmul_add(**case)
    result = optimize_quiet(model, target=target)
    fused = assert_fusion(
        model, result, counts={"matmul_add": 1}, ops=["Gemm"], rtol=1e-5, atol=1e-5
    )
    (gemm,) = fused.graph.node
    assert list(gemm.input) == ["x", "w", "b"]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in gemm.attribute}
    assert attrs.get("alpha", 1.0) == 1.0 and attrs.get("beta", 1.0) == 1.0
    assert attrs.get("transA", 0) == 0 and attrs.get("transB", 0) == 0


def test_then_relu_becomes_fused_gemm_on_onnxruntime():
    model = matmul_add((4,), tail="y = Relu (s)")
    result = optimize_quiet(model, target="onnxruntime")
    assert_fusion(
        model,
        result,
        counts={"matmul_add": 1, "gemm_activation": 1},
        ops=["com.microsoft::FusedGemm"],
        rtol=1e-5,
        atol=1e-5,
    )


# ---------------------------------------------------------------------------------------
# Negative cases.


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        (dict(bias_shape=(4,), x_shape=(2, 3, 5)), "the rank of mm.in0 ('x') is 3"),
        (dict(bias_shape=(2, 1, 4), x_shape=(1, 5)), "does not broadcast"),
    ],
    ids=["rank3-input", "bias-grows-the-output"],
)
def test_no_fusion_and_the_reason(case, reason):
    model = matmul_add(**case)
    result = optimize_quiet(model)
    assert result.counts == {}
    assert_no_fusion(
        model,
        result,
        pattern="matmul_add",
        reason=reason,
        ops=["MatMul", "Add"],
        rtol=1e-5,
        atol=1e-5,
    )
