"""``merge_siblings`` (qkv_bias_merge, qkv_merge, kv_bias_merge, kv_merge): MatMuls that
share their input, with constant 2-D weights and optional constant bias Adds, become one
MatMul over the concatenated weights [+ one Add] + Split.

Tolerance: rtol = atol = 1e-5. A wider GEMM may block (and so sum) differently from the
separate ones; at these sizes onnxruntime's results were bit-identical.
"""

from __future__ import annotations

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
TARGETS = ["generic", "onnxruntime"]


def siblings_model(
    widths=(16, 16, 16),
    *,
    bias=True,
    rows=(2, 5),
    x_dim: int | str = 16,
    weight_rows=None,
    sources=None,
    bias_shapes=None,
    bias_inputs=(),
    opset=17,
    relu=True,
    extra_inputs="",
    extra_outputs="",
    extra_body="",
    seed=0,
) -> onnx.ModelProto:
    """``m_i = MatMul(src_i, w_i)`` [``a_i = Add(m_i, b_i)``] [``y_i = Relu(...)``] for each
    width; sources default to the one input ``x[*rows, x_dim]``; every result is a graph
    output. ``bias_inputs`` lists the siblings whose bias is a graph input."""
    rng = np.random.default_rng(seed)
    dims = ", ".join(str(d) for d in rows)
    sources = sources or ["x"] * len(widths)
    inits, body, outputs = {}, [], []
    graph_inputs = [f"float[{dims}, {x_dim}] {s}" for s in dict.fromkeys(sources)]
    for i, width in enumerate(widths):
        k = weight_rows[i] if weight_rows else 16
        inits[f"w{i}"] = rng.standard_normal((k, width)) * 0.25
        body.append(f"m{i} = MatMul ({sources[i]}, w{i})")
        last = f"m{i}"
        if bias:
            shape = bias_shapes[i] if bias_shapes else (width,)
            if i in bias_inputs:
                graph_inputs.append(f"float{list(shape)} b{i}")
            else:
                inits[f"b{i}"] = rng.standard_normal(shape)
            body.append(f"a{i} = Add ({last}, b{i})")
            last = f"a{i}"
        if relu:
            body.append(f"y{i} = Relu ({last})")
            last = f"y{i}"
        outputs.append(f"float[{dims}, {width}] {last}")
    text = f"""<ir_version: 8, opset_import: ["" : {opset}]>
    g ({", ".join(graph_inputs)}{extra_inputs}) => ({", ".join(outputs)}{extra_outputs}) {{
        {chr(10).join(body)}
        {extra_body}
    }}"""
    return build_model(text, inits)


def merged_ops(n: int, bias: bool, relu: bool = True) -> list[str]:
    return ["MatMul"] + (["Add"] if bias else []) + ["Split"] + (["Relu"] * n if relu else [])


def initializers(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}


def the_split(model: onnx.ModelProto) -> onnx.NodeProto:
    (split,) = [n for n in model.graph.node if n.op_type == "Split"]
    return split


def split_attrs(split: onnx.NodeProto) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in split.attribute}


CASES = {
    "qkv-bias": (3, True, "qkv_bias_merge"),
    "qkv": (3, False, "qkv_merge"),
    "kv-bias": (2, True, "kv_bias_merge"),
    "kv": (2, False, "kv_merge"),
}


@pytest.mark.parametrize(("n", "bias", "pattern"), CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("target", TARGETS)
def test_siblings_merge(target, n, bias, pattern):
    model = siblings_model((16,) * n, bias=bias)
    result = optimize_quiet(model, target=target)
    fused = assert_fusion(model, result, counts={pattern: 1}, ops=merged_ops(n, bias), **TOL)
    weights = initializers(fused)
    matmul = fused.graph.node[0]
    assert matmul.input[0] == "x"
    original = initializers(model)
    expected = np.concatenate([original[f"w{i}"] for i in range(n)], axis=1)
    np.testing.assert_array_equal(weights[matmul.input[1]], expected)
    if bias:
        add = fused.graph.node[1]
        expected_bias = np.concatenate([original[f"b{i}"] for i in range(n)])
        np.testing.assert_array_equal(weights[add.input[1]], expected_bias)
    assert not {f"w{i}" for i in range(n)} & weights.keys(), "the old weights stay"
    split = the_split(fused)
    assert split_attrs(split) == {"axis": -1}
    assert weights[split.input[1]].tolist() == [16] * n
    assert list(split.output) == [f"{'a' if bias else 'm'}{i}" for i in range(n)]


def test_unequal_widths_grouped_query_attention():
    """K and V narrower than Q (grouped-query attention)."""
    model = siblings_model((16, 8, 8))
    result = optimize_quiet(model)
    fused = assert_fusion(
        model, result, counts={"qkv_bias_merge": 1}, ops=merged_ops(3, True), **TOL
    )
    assert initializers(fused)[the_split(fused).input[1]].tolist() == [16, 8, 8]


def test_sibling_results_as_graph_outputs():
    model = siblings_model(relu=False)
    result = optimize_quiet(model)
    fused = assert_fusion(
        model, result, counts={"qkv_bias_merge": 1}, ops=["MatMul", "Add", "Split"], **TOL
    )
    assert [o.name for o in fused.graph.output] == ["a0", "a1", "a2"]


def test_biases_of_shape_1xN_and_scalar_become_one_vector():
    model = siblings_model(bias_shapes=[(1, 16), (), (16,)])
    result = optimize_quiet(model)
    fused = assert_fusion(
        model, result, counts={"qkv_bias_merge": 1}, ops=merged_ops(3, True), **TOL
    )
    original = initializers(model)
    merged = initializers(fused)[fused.graph.node[1].input[1]]
    assert merged.shape == (48,)
    np.testing.assert_array_equal(merged[16:32], np.full(16, original["b1"]))


@pytest.mark.parametrize(
    ("opset", "inputs", "attrs"),
    [
        (13, 2, {"axis": -1}),
        (11, 1, {"axis": -1, "split": [16, 8, 8]}),
        (10, 1, {"axis": 2, "split": [16, 8, 8]}),
    ],
    ids=["opset13-sizes-input", "opset11-sizes-attribute", "opset10-positive-axis"],
)
def test_split_follows_the_opset(opset, inputs, attrs):
    model = siblings_model((16, 8, 8), opset=opset)
    result = optimize_quiet(model)
    fused = assert_fusion(
        model, result, counts={"qkv_bias_merge": 1}, ops=merged_ops(3, True), **TOL
    )
    split = the_split(fused)
    assert len(split.input) == inputs
    assert split_attrs(split) == attrs


@pytest.mark.parametrize("target", TARGETS)
def test_rank2_input_merges_first_then_becomes_gemm(target):
    """matmul_add matches each 2-D sibling too; the merge outranks it, and the merged
    MatMul + Add becomes a Gemm in the next round."""
    model = siblings_model(rows=(10,))
    result = optimize_quiet(model, target=target)
    assert_fusion(
        model,
        result,
        counts={"qkv_bias_merge": 1, "matmul_add": 1},
        ops=["Gemm", "Split", "Relu", "Relu", "Relu"],
        **TOL,
    )
    assert [a.round for a in result.applied] == [1, 2]


# ---------------------------------------------------------------------------------------
# Negative cases.


def test_weights_with_different_leading_dims():
    """Only possible when x's last dimension is unknown (the model then cannot run, so
    there is no numerical check): the rewriter refuses."""
    model = siblings_model(x_dim="K", weight_rows=[16, 8, 16])
    result = optimize_quiet(model, patterns=["qkv_bias_merge"])
    assert result.counts == {}
    reasons = misses(result, "qkv_bias_merge")
    expected = "the weight 'w1' ([8, 16], float32) does not share the leading dimension"
    assert any(expected in r for r in reasons), reasons
    fused = result.to_proto()
    assert op_sequence(fused) == op_sequence(model)
    onnx.checker.check_model(fused, full_check=True)


# (case, the reason qkv_bias_merge gives alone, what all patterns then do, resulting ops)
FALLBACKS = {
    "weight-read-by-another-node": (
        dict(
            extra_inputs=", float[2, 5, 16] z",
            extra_outputs=", float[2, 5, 16] o",
            extra_body="o = MatMul (z, w0)",
        ),
        "q.in1 ('w0') has 2 consumer(s)",
        # The two siblings whose weights are their own merge.
        {"kv_bias_merge": 1},
        ["MatMul", "Add", "Relu", "MatMul", "Add", "Split", "Relu", "Relu", "MatMul"],
    ),
    "bias-is-a-graph-input": (
        dict(bias_inputs=(0,)),
        "q_bias.in1 ('b0') is not a constant initializer",
        # The MatMuls merge without their biases.
        {"qkv_merge": 1},
        ["MatMul", "Split", "Add", "Relu", "Add", "Relu", "Add", "Relu"],
    ),
    "matmul-output-read-outside": (
        dict(extra_outputs=", float[2, 5, 16] r", extra_body="r = Relu (m0)"),
        "q.out0 ('m0') is also used by Relu",
        {"qkv_merge": 1},
        ["MatMul", "Split", "Add", "Relu", "Add", "Relu", "Add", "Relu", "Relu"],
    ),
}


@pytest.mark.parametrize(
    ("case", "reason", "counts", "ops"), FALLBACKS.values(), ids=FALLBACKS.keys()
)
def test_no_qkv_bias_merge_and_the_fallback(case, reason, counts, ops):
    model = siblings_model(**case)
    alone = optimize_quiet(model, patterns=["qkv_bias_merge"])
    assert_no_fusion(
        model, alone, pattern="qkv_bias_merge", reason=reason, ops=op_sequence(model), **TOL
    )
    result = optimize_quiet(model)
    assert_fusion(model, result, counts=counts, ops=ops, **TOL)


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_siblings_reading_different_inputs_do_not_match(bias):
    model = siblings_model((16, 16), bias=bias, sources=["x1", "x2"])
    result = optimize_quiet(model)
    assert result.counts == {}
    assert [m for m in result.near_misses if m.pattern.endswith("merge")] == []
    fused = result.to_proto()
    assert op_sequence(fused) == op_sequence(model)
    onnx.checker.check_model(fused, full_check=True)
    run_both(model, fused, **TOL)


KV = {
    "name": "mine.kv",
    "nodes": [
        {"id": "k", "op": "MatMul", "inputs": {0: "$x"}},
        {"id": "v", "op": "MatMul", "inputs": {0: "$x"}},
        {"id": "k_bias", "op": "Add", "inputs": {0: "k"}},
    ],
}


@pytest.mark.parametrize(
    ("params", "field", "message"),
    [
        ({"matmul_nodes": ["k", "q"]}, "rewriter.params.matmul_nodes", "'q' names no node"),
        (
            {"matmul_nodes": ["k", "v"], "add_nodes": ["k_bias"]},
            "rewriter.params.add_nodes",
            "give one Add per MatMul (2), or none",
        ),
        ({"matmul_nodes": ["k"]}, "rewriter.params.matmul_nodes", "at least 2"),
    ],
    ids=["unknown-node", "adds-do-not-pair-up", "one-matmul"],
)
def test_params_are_checked_when_the_pattern_compiles(params, field, message):
    raw = KV | {"rewriter": {"name": "merge_siblings", "params": params}}
    with pytest.raises(PatternError) as info:
        compile_pattern(raw)
    assert any(path == field and message in text for path, text in info.value.errors), (
        info.value.errors
    )
