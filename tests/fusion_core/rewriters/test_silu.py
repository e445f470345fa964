"""``silu``: ``x * Sigmoid(x)`` -> com.microsoft QuickGelu(alpha=1) (onnxruntime); generic
keeps the pair (onnxruntime runs ONNX Swish slower) unless a pattern asks for Swish
(opset >= 24). Alone, after Conv (+ BatchNormalization, which folds), after MatMul + Add
(a Gemm when 2-D) and after Gemm.

Tolerance: rtol = atol = 1e-5. QuickGelu computes ``x * sigmoid(x)`` in one kernel; with
the BatchNormalization folded into the Conv the sums are reordered (measured: below
1e-6 absolute on these inputs).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import (
    assert_fusion,
    assert_no_fusion,
    bn_params,
    build_model,
    op_sequence,
    optimize_quiet,
)

TOL = dict(rtol=1e-5, atol=1e-5)

# `a` is the activation's input; each head computes it from `x`.
HEADS = {
    "alone": ("float[2, 8, 5, 5] x", "a = Identity (x)", []),
    "after-conv": ("float[2, 4, 5, 5] x", "a = Conv <pads = [1, 1, 1, 1]> (x, w, b)", ["Conv"]),
    "after-conv-bn": (
        "float[2, 4, 5, 5] x",
        "c = Conv <pads = [1, 1, 1, 1]> (x, w)\n a = BatchNormalization (c, bn_scale, bn_bias,"
        " bn_mean, bn_var)",
        ["Conv"],
    ),
    "after-matmul-add-2d": ("float[3, 16] x", "m = MatMul (x, w)\n a = Add (m, b)", ["Gemm"]),
    "after-matmul-add-3d": (
        "float[2, 3, 16] x",
        "m = MatMul (x, w)\n a = Add (m, b)",
        ["MatMul", "Add"],
    ),
    "after-gemm": ("float[3, 16] x", "a = Gemm <transB = 1> (x, w, b)", ["Gemm"]),
}
OUT_SHAPE = {
    "alone": [2, 8, 5, 5],
    "after-conv": [2, 8, 5, 5],
    "after-conv-bn": [2, 8, 5, 5],
    "after-matmul-add-2d": [3, 16],
    "after-matmul-add-3d": [2, 3, 16],
    "after-gemm": [3, 16],
}
# The fusions besides silu: the BN folds, a 2-D MatMul + Add becomes a Gemm.
OTHERS = {"after-conv-bn": {"conv_bn": 1}, "after-matmul-add-2d": {"matmul_add": 1}}

SIG_FIRST = "s = Sigmoid (a)\n y = Mul (s, a)"
X_FIRST = "s = Sigmoid (a)\n y = Mul (a, s)"


def silu_model(
    head: str,
    body: str = X_FIRST,
    *,
    opset: int = 17,
    extra_inputs: str = "",
    extra_outputs: str = "",
    seed: int = 0,
    constants: dict[str, float] | None = None,
) -> onnx.ModelProto:
    x_decl, head_text, _ = HEADS[head]
    rng = np.random.default_rng(seed)
    inits: dict[str, np.ndarray] = {k: np.float32(v) for k, v in (constants or {}).items()}
    if head.startswith("after-conv"):
        inits["w"] = rng.standard_normal((8, 4, 3, 3)) * 0.5
        if head == "after-conv":
            inits["b"] = rng.standard_normal(8)
        else:
            inits |= bn_params(rng, 8)
    elif head != "alone":
        inits["w"] = rng.standard_normal((16, 16)) * 0.5
        inits["b"] = rng.standard_normal(16)
    text = f"""<ir_version: 10, opset_import: ["" : {opset}]>
    g ({x_decl}{extra_inputs}) => (float{OUT_SHAPE[head]} y{extra_outputs}) {{
    {head_text}
    {body}
    }}"""
    return build_model(text, inits)


CASES = [
    pytest.param(head, body, id=f"{head}-{order}")
    for head in HEADS
    for order, body in (("x-first", X_FIRST), ("sigmoid-first", SIG_FIRST))
]


def _head_ops(head: str) -> list[str]:
    return [] if head == "alone" else HEADS[head][2]


@pytest.mark.parametrize(("head", "body"), CASES)
def test_onnxruntime_emits_quick_gelu(head, body):
    model = silu_model(head, body)
    result = optimize_quiet(model, target="onnxruntime")
    ops = _head_ops(head) + ["com.microsoft::QuickGelu"]  # the pre-passes drop an Identity
    fused = assert_fusion(model, result, counts={"silu": 1, **OTHERS.get(head, {})}, ops=ops, **TOL)
    node = fused.graph.node[-1]
    assert node.output == ["y"]
    assert [(a.name, a.f) for a in node.attribute] == [("alpha", 1.0)]


@pytest.mark.parametrize(("head", "body"), CASES)
def test_generic_keeps_the_pair_and_says_why(head, body):
    """The BN still folds and the MatMul + Add still becomes a Gemm."""
    model = silu_model(head, body)
    result = optimize_quiet(model, target="generic")
    assert result.counts == OTHERS.get(head, {})
    assert_no_fusion(
        model,
        result,
        pattern="silu",
        reason="generic: onnxruntime runs ONNX Swish (opset 24) as Mul, Sigmoid, Mul",
        ops=_head_ops(head) + ["Sigmoid", "Mul"],
        **TOL,
    )


SWISH_PATTERN = {
    "name": "mine.silu_swish",
    "targets": ["generic"],
    "nodes": [
        {"id": "sig", "op": "Sigmoid", "inputs": {0: "$x"}},
        {"id": "out", "op": "Mul", "inputs": {1: "sig"}},
    ],
    "rewriter": {"name": "silu", "params": {"swish": True}},
}


def test_generic_swish_when_a_pattern_asks_for_it():
    model = silu_model("after-conv", opset=24)
    result = optimize_quiet(
        model, target="generic", patterns=["mine.silu_swish"], extra_patterns=[SWISH_PATTERN]
    )
    assert_fusion(model, result, counts={"mine.silu_swish": 1}, ops=["Conv", "Swish"], **TOL)


def test_generic_swish_below_opset_24_names_the_upgrade():
    model = silu_model("after-conv", opset=18)
    result = optimize_quiet(
        model, target="generic", patterns=["mine.silu_swish"], extra_patterns=[SWISH_PATTERN]
    )
    assert_no_fusion(
        model,
        result,
        pattern="mine.silu_swish",
        reason="ONNX Swish needs opset 24; the model imports opset 18 (--upgrade-opset 24",
        ops=["Conv", "Sigmoid", "Mul"],
        **TOL,
    )


# ---------------------------------------------------------------------------------------
# Negative cases: no match, and the reason.

NEGATIVE = {
    "gate-of-another-value": (
        dict(body="s = Sigmoid (a)\n y = Mul (g, s)", extra_inputs=", float[2, 3, 16] g"),
        "not a SiLU: out (Mul -> 'y') multiplies 's' by 'g', not by the activation's input 'a'",
    ),
    "sigmoid-squared": (
        dict(body="s = Sigmoid (a)\n y = Mul (s, s)"),
        "not a SiLU: out (Mul -> 'y') multiplies 's' by 's', not by the activation's input 'a'",
    ),
    "sigmoid-is-a-graph-output": (
        dict(extra_outputs=", float[2, 3, 16] s"),
        "sig.out0 ('s') is a graph output",
    ),
}


@pytest.mark.parametrize("target", ["generic", "onnxruntime"])
@pytest.mark.parametrize(("case", "reason"), NEGATIVE.values(), ids=NEGATIVE.keys())
def test_no_fusion_and_the_reason(case, reason, target):
    model = silu_model("after-matmul-add-3d", **case)
    result = optimize_quiet(model, target=target)
    assert result.counts == {}
    assert_no_fusion(model, result, pattern="silu", reason=reason, ops=op_sequence(model), **TOL)


# ---------------------------------------------------------------------------------------
# x * Sigmoid(alpha * x): CLIP's quick_gelu (alpha 1.702), the pattern quick_gelu.

QUICK = {
    "scale-first": "q = Mul (alpha, a)\n s = Sigmoid (q)\n y = Mul (s, a)",
    "x-first": "q = Mul (a, alpha)\n s = Sigmoid (q)\n y = Mul (a, s)",
}


@pytest.mark.parametrize("alpha", [1.702, 0.5])
@pytest.mark.parametrize("body", list(QUICK.values()), ids=list(QUICK))
def test_quick_gelu_keeps_its_alpha(body, alpha):
    model = silu_model("after-matmul-add-3d", body, constants={"alpha": alpha})
    result = optimize_quiet(model, target="onnxruntime")
    ops = ["MatMul", "Add", "com.microsoft::QuickGelu"]
    fused = assert_fusion(model, result, counts={"quick_gelu": 1}, ops=ops, **TOL)
    node = fused.graph.node[-1]
    assert [(a.name, round(a.f, 6)) for a in node.attribute] == [("alpha", round(alpha, 6))]


def test_quick_gelu_of_another_value_is_a_near_miss():
    body = "q = Mul (a, alpha)\n s = Sigmoid (q)\n y = Mul (g, s)"
    model = silu_model(
        "after-matmul-add-3d", body, extra_inputs=", float[2, 3, 16] g", constants={"alpha": 1.702}
    )
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts == {}
    reason = "not x * Sigmoid(alpha * x): out (Mul -> 'y') multiplies 's' by 'g'"
    assert_no_fusion(
        model, result, pattern="quick_gelu", reason=reason, ops=op_sequence(model), **TOL
    )
