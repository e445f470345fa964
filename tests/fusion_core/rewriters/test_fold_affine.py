"""``fold_affine``: conv_add (Add, Sub) and conv_mul (Mul, Div) with a constant."""

from __future__ import annotations

import json

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
PATTERN = {"Add": "conv_add", "Sub": "conv_add", "Mul": "conv_mul", "Div": "conv_mul"}


def conv_then(op, shape, *, constant_first=False, bias=True, transpose_group=0, seed=0):
    """x -> Conv (or ConvTranspose with ``transpose_group``) -> ``op`` with constant k."""
    rng = np.random.default_rng(seed)
    if transpose_group:
        inits = {"w": rng.standard_normal((4, 6 // transpose_group, 3, 3))}
        conv = f"ConvTranspose <group = {transpose_group}, strides = [2, 2]>"
        out = "float[1, 6, 13, 13]"
    else:
        inits = {"w": rng.standard_normal((6, 4, 3, 3))}
        conv, out = "Conv <pads = [1, 1, 1, 1]>", "float[1, 6, 6, 6]"
    inputs = "x, w"
    if bias:
        inits["cb"] = rng.standard_normal(6)
        inputs += ", cb"
    # Away from zero, so Div is well conditioned; mixed signs.
    k = rng.uniform(0.5, 2.0, shape) * np.where(rng.random(shape) < 0.5, -1.0, 1.0)
    inits["k"] = np.asarray(k)
    args = "k, c" if constant_first else "c, k"
    text = f"""{HEADER}
    g (float[1, 4, 6, 6] x) => ({out} y) {{
        c = {conv} ({inputs})
        y = {op} ({args})
    }}"""
    return build_model(text, inits)


SHAPES = [(6, 1, 1), (1, 6, 1, 1), (), (1,), (1, 1, 1, 1)]
SHAPE_IDS = ["Cx1x1", "1xCx1x1", "scalar", "one", "1x1x1x1"]


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_per_channel_constant_folds_into_conv(op, shape):
    model = conv_then(op, shape)
    result = optimize_quiet(model)
    assert_fusion(model, result, counts={PATTERN[op]: 1}, ops=["Conv"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Add", "Mul"])
@pytest.mark.parametrize("shape", SHAPES[1:3], ids=SHAPE_IDS[1:3])
def test_commutative_op_with_the_constant_first(shape, op):
    model = conv_then(op, shape, constant_first=True)
    result = optimize_quiet(model)
    assert_fusion(model, result, counts={PATTERN[op]: 1}, ops=["Conv"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
def test_conv_without_bias(op):
    model = conv_then(op, (1, 6, 1, 1), bias=False)
    result = optimize_quiet(model)
    assert_fusion(model, result, counts={PATTERN[op]: 1}, ops=["Conv"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group", [1, 2], ids=["group1", "group2"])
@pytest.mark.parametrize("op", ["Add", "Mul", "Div"])
def test_conv_transpose(op, group):
    model = conv_then(op, (6, 1, 1), transpose_group=group)
    result = optimize_quiet(model)
    assert_fusion(
        model, result, counts={PATTERN[op]: 1}, ops=["ConvTranspose"], rtol=1e-5, atol=1e-5
    )


def test_mul_then_add_fold_in_two_rounds_with_provenance():
    rng = np.random.default_rng(1)
    text = f"""{HEADER}
    g (float[1, 4, 6, 6] x) => (float[1, 6, 6, 6] y) {{
        [conv1] c = Conv <pads = [1, 1, 1, 1]> (x, w, cb)
        [mul1] m = Mul (c, s)
        [add1] y = Add (m, t)
    }}"""
    inits = {
        "w": rng.standard_normal((6, 4, 3, 3)),
        "cb": rng.standard_normal(6),
        "s": rng.uniform(0.5, 2.0, (6, 1, 1)),
        "t": rng.standard_normal((1, 6, 1, 1)),
    }
    model = build_model(text, inits)
    result = optimize_quiet(model)
    fused = assert_fusion(
        model,
        result,
        counts={"conv_mul": 1, "conv_add": 1},
        ops=["Conv"],
        rtol=1e-5,
        atol=1e-5,
    )
    assert result.rounds == 3  # two that fuse, one that finds nothing left
    props = {p.key: p.value for p in fused.graph.node[0].metadata_props}
    assert props["autofusion.pattern"] == "conv_add"
    assert json.loads(props["autofusion.replaced_nodes"]) == ["conv1", "mul1", "add1"]
    assert json.loads(props["autofusion.replaced_values"]) == ["c", "m"]


# ---------------------------------------------------------------------------------------
# Negative cases.


def conv_div_by_zero():
    model = conv_then("Div", (6, 1, 1))
    k = next(t for t in model.graph.initializer if t.name == "k")
    zero_in_it = np.array([1, 2, 0, 3, 4, 5], dtype=np.float32).reshape(6, 1, 1)
    k.CopyFrom(onnx.numpy_helper.from_array(zero_in_it, "k"))
    return model


@pytest.mark.parametrize(
    ("make", "pattern", "reason"),
    [
        (lambda: conv_then("Mul", (1, 1, 6, 6)), "conv_mul", "not per-channel"),
        (lambda: conv_then("Add", (1, 1, 6, 6)), "conv_add", "not per-channel"),
        (lambda: conv_then("Mul", (6,)), "conv_mul", "not per-channel"),
        (conv_div_by_zero, "conv_mul", "divides by zero"),
    ],
    ids=["mul-1x1xHxW", "add-1x1xHxW", "mul-C-on-last-axis", "div-by-zero"],
)
def test_no_fusion_and_the_reason(make, pattern, reason):
    model = make()
    op = model.graph.node[-1].op_type
    result = optimize_quiet(model)
    assert result.counts == {}
    assert_no_fusion(
        model, result, pattern=pattern, reason=reason, ops=["Conv", op], rtol=1e-5, atol=1e-5
    )
