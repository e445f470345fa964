"""``layer_norm``, ``fold_layer_norm_affine``, ``rms_norm`` and ``skip_layer_norm``: written-out
normalizations -> LayerNormalization / RMSNormalization (generic and onnxruntime),
onnxruntime's SimplifiedLayerNormalization, and com.microsoft.SkipLayerNormalization.

Inputs are ``[2, 5, 16]``, normalized over the last axis. Tolerance: rtol = atol = 1e-5
everywhere (the fused kernels and the chains differ by a few 1e-7 on standard-normal
inputs; atol covers outputs near zero).

onnxruntime's LayerNormalization below opset 17 and its SimplifiedLayerNormalization are
its own registrations in the ONNX domain: a model with them runs in onnxruntime but
``onnx.checker`` rejects it. For those cases the fourth assertion is
``assert_valid_but_for``: the checker rejects exactly that op at that opset, and the
model passes the full check once that op is moved to a domain the checker does not know.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from autofusion.fusion_core.testing import (
    assert_fusion,
    assert_no_fusion,
    build_model,
    op_sequence,
    optimize_quiet,
    run_both,
)

TOL = dict(rtol=1e-5, atol=1e-5)
TARGETS = ["generic", "onnxruntime"]
SKIP_LN = "com.microsoft::SkipLayerNormalization"
WRITTEN_OUT = ["ReduceMean", "Sub", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "Add"]


def header(opset: int) -> str:
    return f'<ir_version: 10, opset_import: ["" : {opset}]>'


def reduce_mean(out: str, src: str, *, opset: int, axes, keepdims: int, name: str) -> str:
    """ReduceMean over ``axes``: an attribute below opset 18, the input ``axes`` from it."""
    if opset < 18:
        return f"[{name}] {out} = ReduceMean <axes = {list(axes)}, keepdims = {keepdims}> ({src})"
    return f"[{name}] {out} = ReduceMean <keepdims = {keepdims}> ({src}, axes)"


def layer_norm_body(
    x: str,
    *,
    opset: int,
    square: str = "pow",
    divide: str = "div",
    axes=(-1,),
    keepdims: int = 1,
) -> list[str]:
    """The written-out layer norm of ``x`` into ``n`` (nodes mean1, var1, pow1, ...)."""
    reduce = dict(opset=opset, axes=axes, keepdims=keepdims)
    lines = [
        reduce_mean("m", x, name="mean1", **reduce),
        f"[sub1] d = Sub ({x}, m)",
        "[pow1] sq = Pow (d, exponent)" if square == "pow" else "[pow1] sq = Mul (d, d)",
        reduce_mean("v", "sq", name="var1", **reduce),
        "[eps1] ve = Add (v, eps)",
        "[sqrt1] s = Sqrt (ve)",
    ]
    if divide == "div":
        lines.append("[div1] n = Div (d, s)")
    else:
        lines += ["[rec1] r = Reciprocal (s)", "[div1] n = Mul (d, r)"]
    return lines


def affine_tail(src: str, *, scale: bool, bias: bool) -> list[str]:
    """``src * gamma + beta`` (either optional) into ``y``."""
    ops = [op for present, op in ((scale, "Mul ({}, gamma)"), (bias, "Add ({}, beta)")) if present]
    ops = ops or ["Identity ({})"]
    lines, current = [], src
    for k, op in enumerate(ops):
        out = "y" if k == len(ops) - 1 else f"t{k}"
        lines.append(f"{out} = {op.format(current)}")
        current = out
    return lines


def constants(rng: np.random.Generator, opset: int, *, exponent=2.0, axes=(-1,)) -> dict:
    inits = {
        "exponent": np.array(exponent),
        "eps": np.array(1e-5),
        "gamma": rng.uniform(0.5, 2.0, 16) * np.where(np.arange(16) % 2, 1, -1),
        "beta": rng.standard_normal(16),
    }
    if opset >= 18:
        inits["axes"] = np.array(axes, dtype=np.int64)
    return inits


def layer_norm_model(
    *,
    opset: int = 18,
    scale: bool = True,
    bias: bool = True,
    gamma_input: bool = False,
    exponent: float = 2.0,
    shape=(2, 5, 16),
    axes=(-1,),
    **variant,
) -> onnx.ModelProto:
    """x -> written-out layer norm -> [* gamma] [+ beta] -> y."""
    rng = np.random.default_rng(0)
    inits = constants(rng, opset, exponent=exponent, axes=axes)
    dims = ", ".join(map(str, shape))
    extra = ", float[16] gamma" if gamma_input else ""
    if gamma_input:
        del inits["gamma"]
    body = layer_norm_body("x", opset=opset, axes=axes, **variant)
    body += affine_tail("n", scale=scale, bias=bias)
    text = f"""{header(opset)}
    g (float[{dims}] x{extra}) => (float[{dims}] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


def the_node(fused: onnx.ModelProto, op_type: str) -> onnx.NodeProto:
    (node,) = [n for n in fused.graph.node if n.op_type == op_type]
    return node


def attributes(node: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def assert_valid_but_for(model: onnx.ModelProto, op_type: str, opset: int) -> None:
    """The checker rejects ``op_type`` in the ONNX domain at ``opset``, and only that."""
    expected = f"No Op registered for {op_type} with domain_version of {opset}"
    with pytest.raises(onnx.checker.ValidationError, match=expected):
        onnx.checker.check_model(model, full_check=True)
    moved = onnx.ModelProto()
    moved.CopyFrom(model)
    for node in moved.graph.node:
        if node.op_type == op_type and node.domain == "":
            node.domain = "test.onnxruntime_own"
    moved.opset_import.append(onnx.helper.make_opsetid("test.onnxruntime_own", 1))
    onnx.checker.check_model(moved, full_check=True)


def assert_onnxruntime_only_fusion(
    model, result, *, counts: dict, ops: list[str], op_type: str, opset: int
) -> onnx.ModelProto:
    """``assert_fusion`` for a result holding one of onnxruntime's own ONNX-domain ops."""
    assert result.counts == counts, f"counts {result.counts}, expected {counts}"
    fused = result.to_proto()
    assert op_sequence(fused) == ops, f"ops {op_sequence(fused)}, expected {ops}"
    assert_valid_but_for(fused, op_type, opset)
    run_both(model, fused, **TOL)
    return fused


# ---------------------------------------------------------------------------------------
# layer_norm (+ layer_norm_scale, layer_norm_bias)

LAYER_NORM_VARIANTS = {
    "opset17-axes-attribute": (dict(opset=17), "layer_norm"),
    "opset18-axes-input": (dict(opset=18), "layer_norm"),
    "axes-rank-minus-1": (dict(opset=18, axes=(2,)), "layer_norm"),
    "axes-attribute-rank-minus-1": (dict(opset=17, axes=(2,)), "layer_norm"),
    # One pattern: the canonical rule norm_spelling writes each spelling as it reads it.
    "self-mul": (dict(square="mul"), "layer_norm"),
    "reciprocal": (dict(divide="recip"), "layer_norm"),
    "self-mul-reciprocal": (dict(opset=17, square="mul", divide="recip"), "layer_norm"),
    "no-bias": (dict(bias=False), "layer_norm"),
    "bias-only": (dict(scale=False), "layer_norm"),
    "no-scale-no-bias": (dict(scale=False, bias=False), "layer_norm"),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("variant", "pattern"), LAYER_NORM_VARIANTS.values(), ids=LAYER_NORM_VARIANTS.keys()
)
def test_layer_norm_becomes_layer_normalization(variant, pattern, target):
    model = layer_norm_model(**variant)
    counts = {pattern: 1}
    if variant.get("scale", True):
        counts["layer_norm_scale"] = 1
    if variant.get("bias", True):
        counts["layer_norm_bias"] = 1
    result = optimize_quiet(model, target=target)
    fused = assert_fusion(model, result, counts=counts, ops=["LayerNormalization"], **TOL)
    node = the_node(fused, "LayerNormalization")
    assert attributes(node)["axis"] == -1
    assert attributes(node)["epsilon"] == pytest.approx(1e-5, rel=1e-6)
    # Without a bias Add, B stays omitted.
    assert len(node.input) == (3 if variant.get("bias", True) else 2)


def test_layer_norm_below_opset17_on_onnxruntime_uses_its_own_layer_normalization():
    model = layer_norm_model(opset=13)
    result = optimize_quiet(model, target="onnxruntime")
    assert_onnxruntime_only_fusion(
        model,
        result,
        counts={"layer_norm": 1, "layer_norm_scale": 1, "layer_norm_bias": 1},
        ops=["LayerNormalization"],
        op_type="LayerNormalization",
        opset=13,
    )


def test_layer_norm_scale_folds_into_an_existing_layer_normalization():
    rng = np.random.default_rng(1)
    text = f"""{header(17)}
    g (float[2, 5, 16] x) => (float[2, 5, 16] y) {{
        n = LayerNormalization <epsilon = 0.001> (x, s, b)
        t = Mul (n, gamma)
        y = Add (beta, t)
    }}"""
    inits = {
        "s": rng.uniform(0.5, 2.0, 16),
        "b": rng.standard_normal(16),
        "gamma": rng.standard_normal((1, 1, 16)),
        "beta": np.array([0.25]),
    }
    model = build_model(text, inits)
    result = optimize_quiet(model)
    fused = assert_fusion(
        model,
        result,
        counts={"layer_norm_scale": 1, "layer_norm_bias": 1},
        ops=["LayerNormalization"],
        **TOL,
    )
    assert attributes(fused.graph.node[0])["epsilon"] == pytest.approx(1e-3)


def test_provenance_of_the_folded_layer_norm_names_every_original_node():
    fused = optimize_quiet(layer_norm_model()).to_proto()
    props = {p.key: p.value for p in the_node(fused, "LayerNormalization").metadata_props}
    assert props["autofusion.pattern"] == "layer_norm_bias"
    replaced = json.loads(props["autofusion.replaced_nodes"])
    names = ["mean1", "sub1", "pow1", "var1", "eps1", "sqrt1", "div1"]
    assert replaced[: len(names)] == names and len(replaced) == len(names) + 2


# ---------------------------------------------------------------------------------------
# rms_norm

RMS_DIVISIONS = {  # one pattern for all: the canonical rule norm_spelling unifies them
    "div": (["[div1] n = Div (x, s)"], ""),
    "reciprocal": (["[rec1] r = Reciprocal (s)", "[div1] n = Mul (x, r)"], ""),
    "div-one": (["[rec1] r = Div (one, s)", "[div1] n = Mul (r, x)"], ""),
}


def rms_norm_model(*, opset: int = 23, divide: str = "div", scale: bool = True) -> onnx.ModelProto:
    """x -> Pow -> ReduceMean -> Add eps -> Sqrt -> (x / rms) -> [gamma *] -> y."""
    rng = np.random.default_rng(2)
    inits = constants(rng, opset) | {"one": np.array(1.0)}
    body = [
        "[pow1] sq = Pow (x, exponent)",
        reduce_mean("v", "sq", opset=opset, axes=(-1,), keepdims=1, name="var1"),
        "[eps1] ve = Add (v, eps)",
        "[sqrt1] s = Sqrt (ve)",
        *RMS_DIVISIONS[divide][0],
        "y = Mul (gamma, n)" if scale else "y = Identity (n)",
    ]
    text = f"""{header(opset)}
    g (float[2, 5, 16] x) => (float[2, 5, 16] y) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


def rms_pattern(divide: str, scale: bool) -> str:
    return "rms_norm" + RMS_DIVISIONS[divide][1] + ("" if scale else "_unscaled")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("scale", [True, False], ids=["gamma", "no-gamma"])
@pytest.mark.parametrize("divide", RMS_DIVISIONS.keys())
def test_rms_norm_becomes_rms_normalization_at_opset23(divide, scale, target):
    model = rms_norm_model(divide=divide, scale=scale)
    result = optimize_quiet(model, target=target)
    fused = assert_fusion(
        model, result, counts={rms_pattern(divide, scale): 1}, ops=["RMSNormalization"], **TOL
    )
    assert attributes(the_node(fused, "RMSNormalization"))["epsilon"] == pytest.approx(1e-5)


@pytest.mark.parametrize("scale", [True, False], ids=["gamma", "no-gamma"])
@pytest.mark.parametrize("divide", RMS_DIVISIONS.keys())
def test_rms_norm_below_opset23_on_onnxruntime_is_simplified_layer_normalization(divide, scale):
    model = rms_norm_model(opset=18, divide=divide, scale=scale)
    result = optimize_quiet(model, target="onnxruntime")
    op = "SimplifiedLayerNormalization"
    assert_onnxruntime_only_fusion(
        model,
        result,
        counts={rms_pattern(divide, scale): 1},
        ops=[op],
        op_type=op,
        opset=18,
    )


# ---------------------------------------------------------------------------------------
# skip_layer_norm (onnxruntime)


def residual_model(
    body: list[str], *, opset: int = 17, inputs: str = "", outputs: str = "", seed: int = 3
) -> onnx.ModelProto:
    """x[2,5,16], r[2,5,16] (plus ``inputs``) -> ``body`` -> y[2,5,16] (plus ``outputs``).

    Constants: w[16, 16], bias[16], LayerNormalization scale ln_s[16] and bias ln_b[16],
    and for an LN over the last two axes ln_s2[5, 16], ln_b2[5, 16].
    """
    rng = np.random.default_rng(seed)
    inits = constants(rng, opset) | {
        "w": rng.standard_normal((16, 16)) / 4,
        "bias": rng.standard_normal(16),
        "ln_s": rng.uniform(0.5, 2.0, 16),
        "ln_b": rng.standard_normal(16),
        "ln_s2": rng.uniform(0.5, 2.0, (5, 16)),
        "ln_b2": rng.standard_normal((5, 16)),
    }
    text = f"""{header(opset)}
    g (float[2, 5, 16] x, float[2, 5, 16] r{inputs}) => (float[2, 5, 16] y{outputs}) {{
        {chr(10).join(body)}
    }}"""
    return build_model(text, inits)


def skip_inputs(fused: onnx.ModelProto) -> list[str]:
    return list(the_node(fused, "SkipLayerNormalization").input)


@pytest.mark.parametrize("opset", [17, 13], ids=["opset17", "opset13"])
def test_residual_add_and_written_out_layer_norm_become_skip_layer_normalization(opset):
    body = ["[res1] h = Add (x, r)", *layer_norm_body("h", opset=opset)]
    model = residual_model(body + affine_tail("n", scale=True, bias=True), opset=opset)
    result = optimize_quiet(model, target="onnxruntime")
    counts = {"layer_norm": 1, "layer_norm_scale": 1, "layer_norm_bias": 1, "skip_layer_norm": 1}
    # Below opset 17 too: SkipLayerNormalization is a com.microsoft op, which the checker
    # passes, so the fused model is valid ONNX again.
    fused = assert_fusion(model, result, counts=counts, ops=[SKIP_LN], **TOL)
    assert skip_inputs(fused)[:2] == ["x", "r"]
    node = the_node(fused, "SkipLayerNormalization")
    replaced = json.loads(
        {p.key: p.value for p in node.metadata_props}["autofusion.replaced_nodes"]
    )
    assert replaced[0] == "res1" and len(replaced) == len(WRITTEN_OUT) + 1


def test_generic_target_keeps_the_residual_add():
    body = ["h = Add (x, r)", *layer_norm_body("h", opset=17)]
    model = residual_model(body + affine_tail("n", scale=True, bias=True))
    result = optimize_quiet(model, target="generic")
    assert_fusion(
        model,
        result,
        counts={"layer_norm": 1, "layer_norm_scale": 1, "layer_norm_bias": 1},
        ops=["Add", "LayerNormalization"],
        **TOL,
    )


LN = "n = LayerNormalization <epsilon = 0.001> (h, ln_s, ln_b)"
SKIP_CASES = {
    # post-LN (BERT): the sum feeds only the LayerNormalization
    "post-ln": (
        ["h = Add (x, r)", LN, "y = MatMul (n, w)"],
        "skip_layer_norm",
        ["x", "r", "ln_s", "ln_b"],
    ),
    "residual-first": (
        ["h = Add (r, x)", LN, "y = MatMul (n, w)"],
        "skip_layer_norm",
        ["r", "x", "ln_s", "ln_b"],
    ),
    "no-beta": (
        ["h = Add (x, r)", "n = LayerNormalization (h, ln_s)", "y = MatMul (n, w)"],
        "skip_layer_norm",
        ["x", "r", "ln_s"],
    ),
    "bias": (
        ["p = Add (x, bias)", "h = Add (r, p)", LN, "y = MatMul (n, w)"],
        "skip_layer_norm_bias",
        ["x", "r", "ln_s", "ln_b", "bias"],
    ),
    "bias-no-beta": (
        [
            "p = Add (bias, x)",
            "h = Add (p, r)",
            "n = LayerNormalization (h, ln_s)",
            "y = MatMul (n, w)",
        ],
        "skip_layer_norm_bias",
        ["x", "r", "ln_s", "", "bias"],
    ),
}


@pytest.mark.parametrize(("body", "pattern", "inputs"), SKIP_CASES.values(), ids=SKIP_CASES.keys())
def test_add_and_layer_normalization_become_skip_layer_normalization(body, pattern, inputs):
    model = residual_model(body)
    result = optimize_quiet(model, target="onnxruntime")
    fused = assert_fusion(model, result, counts={pattern: 1}, ops=[SKIP_LN, "MatMul"], **TOL)
    assert skip_inputs(fused) == inputs
    node = the_node(fused, "SkipLayerNormalization")
    eps = 1e-3 if any("<epsilon" in line for line in body) else 1e-5
    assert attributes(node)["epsilon"] == pytest.approx(eps)


PRE_LN_CASES = {
    "pre-ln": (["h = Add (x, r)"], "skip_layer_norm_pre_ln", ["x", "r", "ln_s", "ln_b"]),
    "pre-ln-bias": (
        ["p = Add (x, bias)", "h = Add (p, r)"],
        "skip_layer_norm_bias_pre_ln",
        ["x", "r", "ln_s", "ln_b", "bias"],
    ),
}


@pytest.mark.parametrize(("sum_", "pattern", "inputs"), PRE_LN_CASES.values(), ids=PRE_LN_CASES)
def test_sum_also_used_by_the_next_residual_is_input_skip_bias_sum(sum_, pattern, inputs):
    # Pre-LN (GPT-2): h = x + r feeds the LayerNormalization and the next residual Add.
    body = [*sum_, LN, "f = MatMul (n, w)", "[next1] y = Add (h, f)"]
    model = residual_model(body)
    result = optimize_quiet(model, target="onnxruntime")
    fused = assert_fusion(model, result, counts={pattern: 1}, ops=[SKIP_LN, "MatMul", "Add"], **TOL)
    node = the_node(fused, "SkipLayerNormalization")
    assert list(node.input) == inputs
    assert list(node.output)[1:] == ["", "", "h"]  # mean and inv_std_var are not produced
    add = the_node(fused, "Add")
    assert add.name == "next1" and "h" in add.input


def pre_ln_chain(blocks: int, *, residual_first: bool, bias: bool) -> list[str]:
    """GPT-2's residual stream: h0 = x + r, h[k+1] = h[k] + f(LN(h[k])) with f a MatMul
    (plus a bias Add), and a final LayerNormalization of h[blocks]."""
    body = ["h0 = Add (x, r)"]
    for k in range(blocks):
        body += [f"n{k} = LayerNormalization (h{k}, ln_s, ln_b)", f"m{k} = MatMul (n{k}, w)"]
        branch = f"m{k}"
        if bias:
            body.append(f"f{k} = Add (m{k}, bias)")
            branch = f"f{k}"
        operands = f"h{k}, {branch}" if residual_first else f"{branch}, h{k}"
        body.append(f"h{k + 1} = Add ({operands})")
    return body + [f"nf = LayerNormalization (h{blocks}, ln_s, ln_b)", "y = MatMul (nf, w)"]


# Each sum but the last feeds two LayerNormalizations' Adds: the candidates of
# neighbouring blocks share an Add, so a round fuses every other block and the next
# round the rest (*_chained_*, named by where the fused neighbour reads the sum).
CHAINS = {
    "residual-first": (
        dict(residual_first=True, bias=False),
        {
            "skip_layer_norm_pre_ln": 2,
            "skip_layer_norm_pre_ln_chained_input": 2,
            "skip_layer_norm": 1,
        },
    ),
    "residual-second": (
        dict(residual_first=False, bias=False),
        {
            "skip_layer_norm_pre_ln": 2,
            "skip_layer_norm_pre_ln_chained_skip": 2,
            "skip_layer_norm": 1,
        },
    ),
    "bias": (
        dict(residual_first=False, bias=True),
        {
            "skip_layer_norm_bias_pre_ln": 2,
            "skip_layer_norm_bias_pre_ln_chained_skip": 1,
            "skip_layer_norm_pre_ln_chained_skip": 1,
            "skip_layer_norm_bias": 1,
        },
    ),
}


@pytest.mark.parametrize(("chain", "counts"), CHAINS.values(), ids=CHAINS.keys())
def test_pre_ln_chain_fuses_every_layer_normalization(chain, counts):
    model = residual_model(pre_ln_chain(4, **chain))
    result = optimize_quiet(model, target="onnxruntime")
    assert_fusion(model, result, counts=counts, ops=[SKIP_LN, "MatMul"] * 5, **TOL)


@pytest.mark.parametrize(
    ("skip_shape", "add"),
    [("1, 5, 16", "Add (x, q)"), ("1, 5, 16", "Add (q, x)"), ("5, 16", "Add (q, x)")],
    ids=["1SH-second", "1SH-first", "SH-first"],
)
def test_broadcast_operand_becomes_the_skip(skip_shape, add):
    # onnxruntime broadcasts only `skip`; a broadcast `input` gives wrong numbers.
    model = residual_model(
        [f"h = {add}", LN, "y = MatMul (n, w)"], inputs=f", float[{skip_shape}] q"
    )
    result = optimize_quiet(model, target="onnxruntime")
    fused = assert_fusion(
        model, result, counts={"skip_layer_norm": 1}, ops=[SKIP_LN, "MatMul"], **TOL
    )
    assert skip_inputs(fused)[:2] == ["x", "q"]


# ---------------------------------------------------------------------------------------
# Negative cases: no fusion, and the near miss says why.


def keepdims0_model() -> onnx.ModelProto:
    # keepdims = 0 on a rank-2 [16, 16] input still gives a valid model (the means then
    # broadcast along the last axis), but it is no longer a layer norm.
    return layer_norm_model(opset=17, keepdims=0, shape=(16, 16))


NEGATIVE_CASES = {
    "non-last-axis": (
        lambda: layer_norm_model(axes=(1,)),
        "layer_norm",
        "ReduceMean 'mean1' reduces axes [1] of a rank-3 input, not only the last axis",
        WRITTEN_OUT,
    ),
    "non-last-axis-attribute": (
        lambda: layer_norm_model(opset=17, axes=(1,)),
        "layer_norm",
        "ReduceMean 'mean1' reduces axes [1] of a rank-3 input, not only the last axis",
        WRITTEN_OUT,
    ),
    "pow-exponent-3": (
        lambda: layer_norm_model(exponent=3.0),
        "layer_norm",
        "the values of sq.in1 ('exponent') is 3.0, expected eq 2",
        WRITTEN_OUT,
    ),
    "keepdims-0": (
        keepdims0_model,
        "layer_norm",
        "mean.keepdims of 'mean1' is 0, expected eq 1",
        WRITTEN_OUT,
    ),
    # The normalization itself still fuses; the Mul by a graph input stays.
    "gamma-not-constant": (
        lambda: layer_norm_model(gamma_input=True),
        "layer_norm_scale",
        "op.in1 ('gamma') is not a constant initializer",
        ["LayerNormalization", "Mul", "Add"],
    ),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize(
    ("make", "pattern", "reason", "ops"), NEGATIVE_CASES.values(), ids=NEGATIVE_CASES.keys()
)
def test_no_fusion_and_the_reason(make, pattern, reason, ops, target):
    model = make()
    result = optimize_quiet(model, target=target)
    assert_no_fusion(model, result, pattern=pattern, reason=reason, ops=ops, **TOL)


def test_layer_norm_below_opset17_on_generic_is_a_near_miss():
    model = layer_norm_model(opset=13)
    result = optimize_quiet(model, target="generic")
    assert result.counts == {}
    assert_no_fusion(
        model,
        result,
        pattern="layer_norm",
        reason="LayerNormalization needs opset 17; the model imports opset 13 (--upgrade-opset 17",
        ops=WRITTEN_OUT,
        **TOL,
    )


def test_rms_norm_below_opset23_on_generic_is_a_near_miss():
    model = rms_norm_model(opset=18)
    result = optimize_quiet(model, target="generic")
    assert result.counts == {}
    assert_no_fusion(
        model,
        result,
        pattern="rms_norm",
        reason="RMSNormalization needs opset 23; the model imports opset 18 (--upgrade-opset 23",
        ops=["Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul"],
        **TOL,
    )


@pytest.mark.parametrize("target", TARGETS)
def test_gamma_not_per_feature_stays_a_mul(target):
    # gamma of shape [5, 1] scales positions, not features: rms_norm does not take it
    # (channelwise constraint), and rms_norm_unscaled fuses the rest.
    model = rms_norm_model()
    gamma = next(t for t in model.graph.initializer if t.name == "gamma")
    values = np.random.default_rng(5).uniform(0.5, 2.0, (5, 1)).astype(np.float32)
    gamma.CopyFrom(onnx.numpy_helper.from_array(values, "gamma"))
    result = optimize_quiet(model, target=target)
    counts = {"rms_norm_unscaled": 1}
    assert_fusion(model, result, counts=counts, ops=["RMSNormalization", "Mul"], **TOL)


def test_intermediate_used_elsewhere_is_a_near_miss():
    body = [*layer_norm_body("x", opset=18), *affine_tail("n", scale=False, bias=False)]
    body.append("z = Abs (d)")
    model = residual_model(body, opset=18, outputs=", float[2, 5, 16] z")
    result = optimize_quiet(model)
    assert_no_fusion(
        model,
        result,
        pattern="layer_norm",
        reason="sub.out0 ('d') is also used by Abs",
        ops=[*WRITTEN_OUT[:7], "Abs"],
        **TOL,
    )


SKIP_NEGATIVE_CASES = {
    "input-broadcast-both-ways": (
        ["h = Add (x, q)", LN, "y = MatMul (n, w)"],
        ", float[2, 1, 16] q",
        "broadcasts only a skip of shape [1, S, H] or [S, H]",
    ),
    "sum-is-a-graph-output": (
        ["h = Add (x, r)", LN, "y = MatMul (n, w)"],
        "",
        "add.out0 ('h') is a graph output",
    ),
    "layer-norm-over-the-last-two-axes": (
        [
            "h = Add (x, r)",
            "n = LayerNormalization <axis = 1> (h, ln_s2, ln_b2)",
            "y = MatMul (n, w)",
        ],
        "",
        "the rank of ln.in1 ('ln_s2') is 2, expected eq 1",
    ),
}


@pytest.mark.parametrize(
    ("body", "inputs", "reason"), SKIP_NEGATIVE_CASES.values(), ids=SKIP_NEGATIVE_CASES.keys()
)
def test_skip_layer_norm_near_misses(body, inputs, reason):
    outputs = ", float[2, 5, 16] h" if "graph output" in reason else ""
    model = residual_model(body, inputs=inputs, outputs=outputs)
    result = optimize_quiet(model, target="onnxruntime")
    assert result.counts == {}
    ops = ["Add", "LayerNormalization", "MatMul"]
    assert_no_fusion(model, result, pattern="skip_layer_norm", reason=reason, ops=ops, **TOL)


def test_a_sum_read_by_two_layer_norms_and_the_next_add_is_exposed():
    """GPT-NeoX's parallel residual: h = x + r feeds both LayerNorms of the next block
    and its residual Add. ``skip_layer_norm_shared_sum`` exposes the sum: the other
    readers read SkipLayerNormalization's input_skip_bias_sum (the other patterns see an
    escape there)."""
    body = [
        "h = Add (x, r)",
        LN,
        "n2 = LayerNormalization (h, ln_s, bias)",
        "a = MatMul (n, w)",
        "m = MatMul (n2, w)",
        "p = Add (h, a)",
        "y = Add (p, m)",
    ]
    model = residual_model(body)
    result = optimize_quiet(model, target="onnxruntime", target_profile="cpu-roofline")
    fused = assert_fusion(
        model, result, counts={"skip_layer_norm_shared_sum": 1},
        ops=op_sequence(result.to_proto()), **TOL,
    )  # fmt: skip
    assert sorted(op_sequence(fused)) == sorted(
        [SKIP_LN, "LayerNormalization", "MatMul", "MatMul", "Add", "Add"]
    )
    node = the_node(fused, "SkipLayerNormalization")
    assert list(node.output)[3] == "h"  # the sum, which the other readers read
    readers = [n.op_type for n in fused.graph.node if "h" in n.input]
    assert sorted(readers) == ["Add", "LayerNormalization"]


def test_an_exposed_sum_that_is_a_graph_output_stays():
    body = ["h = Add (x, r)", LN, "n2 = LayerNormalization (h, ln_s, bias)", "y = Add (n, n2)"]
    model = residual_model(body, outputs=", float[2, 5, 16] h")
    result = optimize_quiet(model, target="onnxruntime", target_profile="cpu-roofline")
    assert result.counts == {}
    reasons = [m.reason for m in result.near_misses if m.pattern == "skip_layer_norm_shared_sum"]
    assert any("add.out0 ('h') is a graph output" in r for r in reasons), reasons
