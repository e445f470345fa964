"""``gelu``: GELU (erf and tanh forms, as exporters write them) -> Gelu (generic, opset >= 20)
or com.microsoft Gelu / FastGelu / BiasGelu (onnxruntime), with and without a bias Add.

Each chain below is the node order an exporter writes (value names shortened), with its
constants stored as float32 initializers, as the exporters store them.

Tolerance: rtol = atol = 1e-5 everywhere. The fused kernels are not bit-identical to the
chains: onnxruntime's FastGelu (and its ONNX Gelu with approximate=tanh, which gives the
same numbers) is documented as ``tanh(0.797885 * x + 0.035677 * x^3)``, and its erf
kernels agree bit for bit with the chain that multiplies by 1/sqrt(2) but not with the
ones that divide by sqrt(2). Measured on inputs three times larger than these (|x| up to
~30): at most 1.2e-7 absolute for the erf form, 9.6e-7 for the tanh form. The relative
error is large only where ``|GELU(x)| < 1e-5`` (the negative tail), hence the atol.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest

from autofusion.fusion_core import PatternError, compile_pattern
from autofusion.fusion_core.testing import (
    assert_fusion,
    assert_no_fusion,
    build_model,
    misses,
    op_sequence,
    optimize_quiet,
    run_both,
)

TOL = dict(rtol=1e-5, atol=1e-5)
CONSTANTS = {
    "sqrt2": math.sqrt(2.0),
    "inv_sqrt2": 1.0 / math.sqrt(2.0),
    "one": 1.0,
    "half": 0.5,
    "three": 3.0,
    "k": 0.044715,
    "c": math.sqrt(2.0 / math.pi),
}

# GELU of `a` into `y`, per variant.
ERF_HALF_LAST = """
    s = Div (a, sqrt2)
    e = Erf (s)
    p = Add (e, one)
    g = Mul (a, p)
    y = Mul (g, half)
"""
ERF_HALF_FIRST = """
    h = Mul (a, half)
    s = Div (a, sqrt2)
    e = Erf (s)
    p = Add (e, one)
    y = Mul (h, p)
"""
ERF_HALF_FIRST_MUL = """
    h = Mul (a, half)
    s = Mul (a, inv_sqrt2)
    e = Erf (s)
    p = Add (one, e)
    y = Mul (h, p)
"""
ERF_HALF_INNER = """
    s = Div (a, sqrt2)
    e = Erf (s)
    p = Add (e, one)
    hp = Mul (half, p)
    y = Mul (a, hp)
"""
TANH_CUBE_HALF_LAST = """
    sq = Mul (a, a)
    cu = Mul (a, sq)
    kc = Mul (k, cu)
    i = Add (a, kc)
    ts = Mul (c, i)
    t = Tanh (ts)
    p = Add (one, t)
    g = Mul (a, p)
    y = Mul (half, g)
"""
TANH_POW_HALF_FIRST = """
    h = Mul (a, half)
    cu = Pow (a, three)
    kc = Mul (cu, k)
    i = Add (a, kc)
    ts = Mul (i, c)
    t = Tanh (ts)
    p = Add (t, one)
    y = Mul (h, p)
"""
TANH_POW_HALF_INNER = """
    cu = Pow (a, three)
    kc = Mul (k, cu)
    i = Add (a, kc)
    ts = Mul (c, i)
    t = Tanh (ts)
    p = Add (t, one)
    hp = Mul (half, p)
    y = Mul (a, hp)
"""

# id: (chain, pattern, form)
VARIANTS = {
    "erf-half-last-torchscript": (ERF_HALF_LAST, "gelu_erf", "erf"),
    "erf-half-first-transformers": (ERF_HALF_FIRST, "gelu_erf", "erf"),
    "erf-half-first-mul-inv-sqrt2": (ERF_HALF_FIRST_MUL, "gelu_erf", "erf"),
    "erf-half-inner-dynamo": (ERF_HALF_INNER, "gelu_erf", "erf"),
    "tanh-cube-half-last-torchscript": (TANH_CUBE_HALF_LAST, "gelu_tanh", "tanh"),
    "tanh-pow-half-first-newgelu": (TANH_POW_HALF_FIRST, "gelu_tanh", "tanh"),
    "tanh-pow-half-inner-dynamo": (TANH_POW_HALF_INNER, "gelu_tanh", "tanh"),
}
CONTRIB = {
    ("erf", False): "Gelu",
    ("erf", True): "BiasGelu",
    ("tanh", False): "FastGelu",
    ("tanh", True): "FastGelu",
}


def gelu_model(
    chain: str,
    *,
    bias: bool = False,
    opset: int = 20,
    rows: tuple[int, ...] = (2, 5),
    out_rows: tuple[int, ...] | None = None,
    extra_inputs: str = "",
    extra_outputs: str = "",
    constants: dict | None = None,
    bias_array: np.ndarray | None = None,
    seed: int = 0,
) -> onnx.ModelProto:
    """x[*rows, 16] -> mm = MatMul(x, w) [-> a = Add(mm, b)] -> GELU chain -> y."""
    rng = np.random.default_rng(seed)
    inits = {"w": rng.standard_normal((16, 16)) * 0.5}
    if bias and "float[16] b" not in extra_inputs:
        inits["b"] = rng.standard_normal(16) if bias_array is None else bias_array
    inits |= {k: np.asarray(v) for k, v in (CONSTANTS | (constants or {})).items()}
    shape, out_shape = list(rows) + [16], list(out_rows or rows) + [16]
    head = "mm = MatMul (x, w)\n    a = Add (mm, b)" if bias else "a = MatMul (x, w)"
    text = f"""<ir_version: 10, opset_import: ["" : {opset}]>
    g (float{shape} x{extra_inputs}) => (float{out_shape} y{extra_outputs}) {{
    {head}
    {chain}
    }}"""
    return build_model(text, inits)


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


CASES = [
    pytest.param(chain, pattern, form, id=key) for key, (chain, pattern, form) in VARIANTS.items()
]


@pytest.mark.parametrize("opset", [17, 20])
@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize(("chain", "pattern", "form"), CASES)
def test_onnxruntime_emits_contrib_gelu(chain, pattern, form, bias, opset):
    model = gelu_model(chain, bias=bias, opset=opset)
    result = optimize_quiet(model, target="onnxruntime")
    op = CONTRIB[(form, bias)]
    fused = assert_fusion(
        model,
        result,
        counts={f"{pattern}_bias" if bias else pattern: 1},
        ops=["MatMul", f"com.microsoft::{op}"],
        **TOL,
    )
    gelu = fused.graph.node[1]
    assert list(gelu.input) == (["mm", "b"] if bias else ["a"])
    assert list(gelu.output) == ["y"]


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize(("chain", "pattern", "form"), CASES)
def test_generic_opset20_emits_gelu(chain, pattern, form, bias):
    model = gelu_model(chain, bias=bias, opset=20)
    result = optimize_quiet(model, target="generic")
    ops = ["MatMul", "Add", "Gelu"] if bias else ["MatMul", "Gelu"]
    fused = assert_fusion(model, result, counts={pattern: 1}, ops=ops, **TOL)
    gelu = fused.graph.node[-1]
    assert list(gelu.input) == ["a"]
    assert attributes(gelu).get("approximate", b"none") == (b"tanh" if form == "tanh" else b"none")


@pytest.mark.parametrize("bias", [False, True], ids=["no-bias", "bias"])
@pytest.mark.parametrize(("chain", "pattern", "form"), CASES)
def test_generic_below_opset20_does_not_fuse(chain, pattern, form, bias):
    model = gelu_model(chain, bias=bias, opset=17)
    result = optimize_quiet(model, target="generic")
    assert result.counts == {}
    assert_no_fusion(
        model,
        result,
        pattern=pattern,
        reason="ONNX Gelu needs opset 20; the model imports opset 17",
        ops=op_sequence(model),
        **TOL,
    )


@pytest.mark.parametrize(
    ("target", "counts", "ops"),
    [
        ("onnxruntime", {"gelu_erf_bias": 1}, ["MatMul", "com.microsoft::BiasGelu"]),
        ("generic", {"matmul_add": 1, "gelu_erf": 1}, ["Gemm", "Gelu"]),
    ],
)
def test_2d_matmul_bias_gelu(target, counts, ops):
    """A 2-D MatMul + Add + GELU: BiasGelu outranks matmul_add on onnxruntime; on generic
    the Add goes into a Gemm and the chain becomes Gelu."""
    model = gelu_model(ERF_HALF_LAST, bias=True, rows=(3,))
    result = optimize_quiet(model, target=target)
    assert_fusion(model, result, counts=counts, ops=ops, **TOL)


def test_constants_written_with_fewer_digits_still_fuse():
    """1.41421, 0.797885 (the FastGelu doc's value) and 0.0447149 are within rel. 1e-5."""
    rounded = {"sqrt2": 1.41421, "c": 0.797885, "k": 0.0447149}
    for chain, pattern in [
        (ERF_HALF_LAST, "gelu_erf"),
        (TANH_POW_HALF_FIRST, "gelu_tanh"),
    ]:
        model = gelu_model(chain, constants=rounded)
        result = optimize_quiet(model, target="generic")
        assert_fusion(model, result, counts={pattern: 1}, ops=["MatMul", "Gelu"], **TOL)


# ---------------------------------------------------------------------------------------
# Negative cases.


def erf_output_exposed():
    return gelu_model(ERF_HALF_LAST, extra_outputs=", float[2, 5, 16] e")


# ---------------------------------------------------------------------------------------
# Negative cases.

NEGATIVE = {
    "div-by-1.5": (
        dict(chain=ERF_HALF_LAST, constants={"sqrt2": 1.5}),
        "gelu_erf",
        "scale.in1 ('sqrt2') of Div is [1.5], expected sqrt(2) = 1.4142136",
    ),
    "mul-by-sqrt2-not-its-inverse": (
        dict(chain=ERF_HALF_FIRST_MUL, constants={"inv_sqrt2": math.sqrt(2.0)}),
        "gelu_erf",
        # the canonical form writes x * sqrt(2) as x / (1 / sqrt(2)), the pattern's Div
        "of Div is [0.7071067690849304], expected sqrt(2)",
    ),
    "tanh-coefficient-0.05": (
        dict(chain=TANH_POW_HALF_FIRST, constants={"k": 0.05}),
        "gelu_tanh",
        "the values of cube_coef.in1 ('k') is 0.05000000074505806, expected le 0.04471545",
    ),
    "one-is-2": (
        dict(chain=TANH_CUBE_HALF_LAST, constants={"one": 2.0}),
        "gelu_tanh",
        "the values of one.in1 ('one') is 2.0, expected eq 1.0",
    ),
    "constant-grows-the-shape": (
        dict(chain=ERF_HALF_FIRST, rows=(5,), out_rows=(2, 5), constants={"half": [[[0.5]]] * 2}),
        "gelu_erf",
        "$x ('a') has shape [5,16] but out.out0 ('y') has shape [2,5,16]",
    ),
    "intermediate-is-graph-output": (
        dict(chain=ERF_HALF_FIRST, extra_outputs=", float[2, 5, 16] e"),
        "gelu_erf",
        "erf.out0 ('e') is a graph output",
    ),
}


@pytest.mark.parametrize("target", ["generic", "onnxruntime"])
@pytest.mark.parametrize(("case", "pattern", "reason"), NEGATIVE.values(), ids=NEGATIVE.keys())
def test_no_fusion_and_the_reason(case, pattern, reason, target):
    model = gelu_model(**case)
    result = optimize_quiet(model, target=target)
    assert result.counts == {}
    assert_no_fusion(model, result, pattern=pattern, reason=reason, ops=op_sequence(model), **TOL)


@pytest.mark.parametrize(
    "case",
    [
        dict(chain=ERF_HALF_INNER, rows=(5,), out_rows=(2, 5), constants={"half": [[[0.5]]] * 2}),
        dict(chain=ERF_HALF_LAST, extra_outputs=", float[2, 5, 16] e"),
        dict(chain=TANH_CUBE_HALF_LAST, extra_outputs=", float[2, 5, 16] cu"),
    ],
    ids=["constant-grows-the-shape", "erf-is-graph-output", "cube-is-graph-output"],
)
def test_a_spelling_the_canonical_form_cannot_rewrite_gets_a_near_miss(case):
    """Where the GELU cannot be written in the patterns' spelling (a value of it read
    elsewhere, a constant that is not a scalar), the probe still finds its Erf or Tanh
    and the near miss names the step of the pattern that failed."""
    model = gelu_model(**case)
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts == {}
    pattern = "gelu_tanh" if "Tanh" in case["chain"] else "gelu_erf"
    reported = misses(result, pattern)
    assert reported and all(r.startswith("expected ") for r in reported), reported
    assert op_sequence(result.to_proto()) == op_sequence(model)  # as it went in


BIAS_NEGATIVE = {
    "bias-is-a-graph-input": (
        dict(chain=ERF_HALF_LAST, extra_inputs=", float[16] b"),
        "gelu_erf",
        "bias.in1 ('b') is not a constant initializer",
        "Gelu",
    ),
    "bias-of-one-element": (
        dict(chain=TANH_POW_HALF_INNER, bias_array=np.array([0.3])),
        "gelu_tanh",
        "the bias 'b' has shape [1] but the data 'mm' has shape [2,5,16]",
        "FastGelu",
    ),
}


@pytest.mark.parametrize(
    ("case", "pattern", "reason", "op"), BIAS_NEGATIVE.values(), ids=BIAS_NEGATIVE.keys()
)
def test_bias_that_does_not_fit_keeps_the_add(case, pattern, reason, op):
    """The bias pattern alone reports why; with every pattern the GELU fuses without it."""
    model = gelu_model(bias=True, **case)
    alone = optimize_quiet(model, target="onnxruntime", patterns=[f"{pattern}_bias"])
    assert_no_fusion(
        model,
        alone,
        pattern=f"{pattern}_bias",
        reason=reason,
        ops=op_sequence(model),
        **TOL,
    )
    result = optimize_quiet(model, target="onnxruntime")
    assert_fusion(
        model,
        result,
        counts={pattern: 1},
        ops=["MatMul", "Add", f"com.microsoft::{op}"],
        **TOL,
    )
    # A rewriter's refusal stays reported after the GELU fused without the bias; a failed
    # constraint only while its chain is still there (it is gone in the last round).
    reported = misses(result, f"{pattern}_bias")
    if reason.startswith("the bias"):
        assert len(reported) == 1 and reported[0].startswith(f"rewriter 'gelu': {reason}")
    else:
        assert reported == []


def test_max_difference_is_far_below_the_tolerance():
    """The tolerance above is not tight: the fused kernels stay within 2e-6 absolute."""
    for chain, _, form in VARIANTS.values():
        for bias in (False, True):
            model = gelu_model(chain, bias=bias)
            fused = optimize_quiet(model, target="onnxruntime").to_proto()
            assert op_sequence(fused)[-1] == f"com.microsoft::{CONTRIB[(form, bias)]}"
            run_both(model, fused, rtol=0, atol=2e-6)


HALF = {
    "name": "mine.half",
    "nodes": [{"id": "out", "op": "Mul", "inputs": {0: "$x"}}],
}


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"input": "$y"}, "'$y' is not a value of the pattern"),
        ({"input": "nope.in0"}, "'nope.in0' is not a value of the pattern"),
        ({"input": "x"}, "is not a value reference"),
    ],
    ids=["unknown-free-input", "unknown-node", "not-a-reference"],
)
def test_input_param_is_checked_when_the_pattern_compiles(params, message):
    raw = HALF | {"rewriter": {"name": "gelu", "params": params}}
    with pytest.raises(PatternError) as info:
        compile_pattern(raw)
    assert any(
        path == "rewriter.params.input" and message in text for path, text in info.value.errors
    ), info.value.errors
