"""``hard_sigmoid`` / ``hard_swish``: HardSigmoid and HardSwish written out as
``Clip(x + 3, 0, 6) / 6`` and ``x * Clip(x + 3, 0, 6) / 6`` (Div by 6 or Mul by 1/6, both
Mul orders, Clip bounds as inputs from opset 11 or attributes before) ->
``HardSigmoid(alpha=1/6, beta=0.5)``; HardSwish -> ``HardSwish`` (generic, opset >= 14)
or ``Mul(x, HardSigmoid(x))`` (below 14, and on onnxruntime at every opset). On
onnxruntime a Conv before a HardSigmoid then becomes FusedConv.

Weights and inputs are scaled so that the activation's input crosses both breakpoints
(-3 and 3). Tolerance: rtol = atol = 1e-5; HardSigmoid computes ``x * (1/6) + 0.5``
where the chain computes ``(x + 3) / 6`` (measured: below 1e-6 absolute).
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
CONSTANTS = {"three": 3.0, "zero": 0.0, "six": 6.0, "div6": 6.0, "sixth": 1.0 / 6.0}

HEADS = {
    "alone": ("a = Identity (x)", []),
    "after-conv": ("a = Conv <pads = [1, 1, 1, 1]> (x, w, b)", ["Conv"]),
    "after-conv-bn": (
        "c0 = Conv <pads = [1, 1, 1, 1]> (x, w)\n"
        " a = BatchNormalization (c0, bn_scale, bn_bias, bn_mean, bn_var)",
        ["Conv"],
    ),
}
CLIP_INPUTS = "c = Clip (s, zero, six)"
CLIP_ATTRS = "c = Clip <min = 0.0, max = 6.0> (s)"

# HardSwish spellings of `a` -> `y`: (body, the patterns that fuse it on generic at 14)
HARDSWISH = {
    "mul-then-div": (
        "s = Add (a, three)\n {clip}\n p = Mul (a, c)\n y = Div (p, div6)",
        {"hard_swish_div": 1},
    ),
    "mul-then-div-swapped": (
        "s = Add (three, a)\n {clip}\n p = Mul (c, a)\n y = Div (p, div6)",
        {"hard_swish_div": 1},
    ),
    "mul-then-mul-sixth": (
        "s = Add (a, three)\n {clip}\n p = Mul (a, c)\n y = Mul (p, sixth)",
        {"hard_swish_mul": 1},
    ),
    "mul-then-sixth-mul": (
        "s = Add (a, three)\n {clip}\n p = Mul (c, a)\n y = Mul (sixth, p)",
        {"hard_swish_mul": 1},
    ),
    "div-then-mul": (
        "s = Add (a, three)\n {clip}\n h = Div (c, div6)\n y = Mul (a, h)",
        {"hard_sigmoid_div": 1, "hard_swish": 1},
    ),
    "sixth-then-mul": (
        "s = Add (a, three)\n {clip}\n h = Mul (c, sixth)\n y = Mul (h, a)",
        {"hard_sigmoid_mul": 1, "hard_swish": 1},
    ),
}
HARDSIGMOID = {
    "div": ("s = Add (a, three)\n {clip}\n y = Div (c, div6)", "hard_sigmoid_div"),
    "mul-sixth": ("s = Add (three, a)\n {clip}\n y = Mul (sixth, c)", "hard_sigmoid_mul"),
}
OTHERS = {"after-conv-bn": {"conv_bn": 1}}


def act_model(
    head: str,
    body: str,
    *,
    opset: int = 11,
    extra_inputs: str = "",
    constants: dict | None = None,
    seed: int = 0,
) -> onnx.ModelProto:
    """x[2, 4, 5, 5] -> [Conv [+ BN] ->] a[2, 8, 5, 5] -> body -> y."""
    rng = np.random.default_rng(seed)
    clip = CLIP_ATTRS if opset < 11 else CLIP_INPUTS
    body = body.replace("{clip}", clip)
    inits = {k: np.asarray(v) for k, v in (CONSTANTS | (constants or {})).items() if k in body}
    channels = 4 if head == "alone" else 8
    if head != "alone":
        inits["w"] = rng.standard_normal((8, 4, 3, 3)) * 1.5
        if head == "after-conv":
            inits["b"] = rng.standard_normal(8)
        else:
            inits |= bn_params(rng, 8)
    text = f"""<ir_version: 10, opset_import: ["" : {opset}]>
    g (float[2, 4, 5, 5] x{extra_inputs}) => (float[2, {channels}, 5, 5] y) {{
    {HEADS[head][0]}
    {body}
    }}"""
    return build_model(text, inits)


def head_ops(head: str) -> list[str]:
    return HEADS[head][1]


SWISH_CASES = [
    pytest.param(head, body, counts, id=f"{key}-{head}")
    for key, (body, counts) in HARDSWISH.items()
    for head in HEADS
]
OPSETS = [pytest.param(10, id="opset10-clip-attrs"), 11, 12, 14]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize(("head", "body", "counts"), SWISH_CASES)
def test_onnxruntime_hardswish_becomes_hardsigmoid_mul(head, body, counts, opset):
    model = act_model(head, body, opset=opset)
    result = optimize_quiet(model, target="onnxruntime")
    first = {k: v for k, v in counts.items() if k != "hard_swish"}  # generic only
    fused = assert_fusion(
        model,
        result,
        counts=first | OTHERS.get(head, {}),
        ops=head_ops(head) + ["HardSigmoid", "Mul"],
        **TOL,
    )
    hsig = fused.graph.node[-2]
    attrs = {a.name: a.f for a in hsig.attribute}
    assert attrs == pytest.approx({"alpha": 1.0 / 6.0, "beta": 0.5})


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize(("head", "body", "counts"), SWISH_CASES)
def test_generic_hardswish(head, body, counts, opset):
    """HardSwish from opset 14; below it x * HardSigmoid(x), and the reason names
    --upgrade-opset."""
    model = act_model(head, body, opset=opset)
    result = optimize_quiet(model, target="generic")
    if opset >= 14:
        assert_fusion(
            model, result, counts=counts | OTHERS.get(head, {}),
            ops=head_ops(head) + ["HardSwish"], **TOL,
        )  # fmt: skip
        return
    first = {k: v for k, v in counts.items() if k != "hard_swish"}
    assert_fusion(
        model, result, counts=first | OTHERS.get(head, {}),
        ops=head_ops(head) + ["HardSigmoid", "Mul"], **TOL,
    )  # fmt: skip
    assert_no_fusion(
        model,
        result,
        pattern="hard_swish",
        reason=f"ONNX HardSwish needs opset 14; the model imports opset {opset} "
        "(--upgrade-opset 14 converts it)",
        ops=head_ops(head) + ["HardSigmoid", "Mul"],
        **TOL,
    )


SIGMOID_CASES = [
    pytest.param(head, body, pattern, id=f"{key}-{head}")
    for key, (body, pattern) in HARDSIGMOID.items()
    for head in HEADS
]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("target", ["generic", "onnxruntime"])
@pytest.mark.parametrize(("head", "body", "pattern"), SIGMOID_CASES)
def test_hardsigmoid(head, body, pattern, target, opset):
    """HardSigmoid on both targets; after a Conv, onnxruntime takes it into FusedConv."""
    model = act_model(head, body, opset=opset)
    result = optimize_quiet(model, target=target)
    counts = {pattern: 1} | OTHERS.get(head, {})
    ops = head_ops(head) + ["HardSigmoid"]
    if target == "onnxruntime" and head != "alone":
        counts["conv_activation"] = 1
        ops = ["com.microsoft::FusedConv"]
    fused = assert_fusion(model, result, counts=counts, ops=ops, **TOL)
    attrs = {a.name: a.f for a in fused.graph.node[-1].attribute if a.type == 1}
    if ops[-1] == "HardSigmoid":
        assert attrs == pytest.approx({"alpha": 1.0 / 6.0, "beta": 0.5})


TORCHSCRIPT_HARDSWISH = "h = HardSigmoid <alpha = 0.16666667> (a)\n y = Mul (a, h)"


@pytest.mark.parametrize("head", list(HEADS))
def test_torchscript_hardswish_below_14_becomes_hardswish_at_14(head):
    """TorchScript writes nn.Hardswish as x * HardSigmoid(x) below opset 14."""
    model = act_model(head, TORCHSCRIPT_HARDSWISH, opset=14)
    result = optimize_quiet(model, target="generic")
    assert_fusion(
        model, result, counts={"hard_swish": 1} | OTHERS.get(head, {}),
        ops=head_ops(head) + ["HardSwish"], **TOL,
    )  # fmt: skip


# ---------------------------------------------------------------------------------------
# Negative cases: no match, and the reason.

MUL_THEN_DIV = HARDSWISH["mul-then-div"][0]
NEGATIVE = {
    "clip-bounds-0-5": (
        dict(body=MUL_THEN_DIV, constants={"six": 5.0}),
        "hard_swish_div",
        "Clip '' clips to [0.0, 5.0], expected [0.0, 6.0] (ReLU6)",
    ),
    "clip-attrs-min-minus-1": (
        dict(body=MUL_THEN_DIV.replace("{clip}", "c = Clip <min = -1.0, max = 6.0> (s)"), opset=10),
        "hard_swish_div",
        "clips to [-1.0, 6.0], expected [0.0, 6.0] (ReLU6)",
    ),
    "clip-without-max": (
        dict(body=MUL_THEN_DIV.replace("{clip}", "c = Clip (s, zero)")),
        "hard_swish_div",
        "clips to [0.0, 3.4028234663852886e+38], expected [0.0, 6.0]",
    ),
    "multiplies-another-value": (
        dict(
            body=MUL_THEN_DIV.replace("Mul (a, c)", "Mul (g, c)"),
            extra_inputs=", float[2, 4, 5, 5] g",
        ),
        "hard_swish_div",
        "not a HardSwish: prod (Mul -> 'p') multiplies 'c' by 'g', not by the activation's "
        "input 'x'",
    ),
    "shift-by-2": (
        dict(body=MUL_THEN_DIV, constants={"three": 2.0}),
        "hard_swish_div",
        "the values of shift.in1 ('three') is 2.0, expected eq 3",
    ),
    "divide-by-5": (
        dict(body=HARDSIGMOID["div"][0], constants={"div6": 5.0}),
        "hard_sigmoid_div",
        "the values of out.in1 ('div6') is 5.0, expected eq 6",
    ),
    "times-0.2": (
        # Add (a, three): with the 3 first, the near miss kept is the swapped order's
        dict(
            body=HARDSIGMOID["mul-sixth"][0].replace("Add (three, a)", "Add (a, three)"),
            constants={"sixth": 0.2},
        ),
        "hard_sigmoid_mul",
        "the values of out.in1 ('sixth') is 0.20000000298023224, expected le 0.1666683",
    ),
}


@pytest.mark.parametrize("target", ["generic", "onnxruntime"])
@pytest.mark.parametrize(("case", "pattern", "reason"), NEGATIVE.values(), ids=NEGATIVE.keys())
def test_no_fusion_and_the_reason(case, pattern, reason, target):
    """On the activation alone: after a Conv, conv_add would fold the Add of 3."""
    model = act_model("alone", **case)
    result = optimize_quiet(model, target=target)
    assert result.counts == {}
    ops = [op for op in op_sequence(model) if op != "Identity"]  # the pre-passes drop it
    assert_no_fusion(model, result, pattern=pattern, reason=reason, ops=ops, **TOL)


def test_hardsigmoid_with_onnx_default_alpha_is_not_a_hardswish():
    """ONNX's HardSigmoid defaults to alpha 0.2, not torch's 1/6."""
    model = act_model("after-conv", "h = HardSigmoid (a)\n y = Mul (a, h)", opset=14)
    result = optimize_quiet(model, target="generic")
    assert result.counts == {}
    assert_no_fusion(
        model,
        result,
        pattern="hard_swish",
        reason="hsig.alpha of '' is 0.20000000298023224, expected le 0.1666683",
        ops=op_sequence(model),
        **TOL,
    )
