"""``packed_attention`` (onnxruntime): Q/K/V projections of one input (separate, or
merged by qkv_bias_merge) + com.microsoft.MultiHeadAttention -> com.microsoft.Attention
with the packed weight inside; a default since it measured level to 1 % faster on BERT
and DistilBERT (docs/benchmarks.md, section 16).

The graph is one BERT self-attention in small: x[2, 5, 16], 4 heads of 4, weights
drawn N(0, 1/4), biases N(0, 1), an additive mask [2, 1, 5, 5] that blocks the last
two keys of the second row. Tolerance: rtol = atol = 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize
from autofusion.fusion_core.testing import (
    build_model,
    misses,
    op_sequence,
    optimize_quiet,
    run_both,
)

TOL = dict(rtol=1e-5, atol=1e-5)
TRANSFORMERS = Path(__file__).resolve().parents[2] / "data" / "transformers"
ATTENTION = "com.microsoft::Attention"


def attention_model(*, v_out: int = 16) -> onnx.ModelProto:
    rng = np.random.default_rng(11)
    inits = {}
    for name, out in (("q", 16), ("k", 16), ("v", v_out)):
        inits[f"w{name}"] = rng.standard_normal((16, out)) / 4
        inits[f"b{name}"] = rng.standard_normal(out)
    mask = np.zeros((2, 1, 5, 5))
    mask[1, :, :, 3:] = -10000.0
    inits["mask"] = mask
    text = f"""<ir_version: 10, opset_import: ["" : 17, "com.microsoft" : 1]>
    g (float[2, 5, 16] x) => (float[2, 5, {v_out}] y) {{
        mq = MatMul (x, wq)
        q = Add (mq, bq)
        mk = MatMul (x, wk)
        k = Add (bk, mk)
        mv = MatMul (x, wv)
        v = Add (mv, bv)
        y = com.microsoft.MultiHeadAttention <num_heads = 4, scale = 0.5> (q, k, v, , , mask)
    }}"""
    return build_model(text, inits)


def optimize_packed(model: onnx.ModelProto):
    return optimize_quiet(model, target="onnxruntime")


def the_packed_attention(model: onnx.ModelProto, pattern: str):
    """The fused model, one Attention with the [16, 48] weight and [48] bias inside."""
    result = optimize_packed(model)
    assert result.counts == {pattern: 1}
    fused = result.to_proto()
    assert op_sequence(fused) == [ATTENTION]
    onnx.checker.check_model(fused, full_check=True)
    (node,) = fused.graph.node
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in fused.graph.initializer}
    assert weights[node.input[1]].shape == (16, 48) and weights[node.input[2]].shape == (48,)
    return fused, node


def test_qkv_projections_and_multi_head_attention_become_one_attention():
    model = attention_model()
    fused, node = the_packed_attention(model, "attention_packed")
    assert list(node.input)[3:] == ["", "", "mask"] and node.input[0] == "x"
    run_both(model, fused, **TOL)


def test_unequal_projections_are_a_near_miss():
    model = attention_model(v_out=8)
    result = optimize_packed(model)
    assert "attention_packed" not in result.counts
    assert any("differ in shape" in r for r in misses(result, "attention_packed"))
    run_both(model, result.to_proto(), **TOL)


def test_the_generic_target_has_no_packed_attention():
    result = optimize_quiet(attention_model(), target="generic")
    assert "attention_packed" not in result.counts
    assert op_sequence(result.to_proto()).count("com.microsoft::MultiHeadAttention") == 1


def merged_model(sizes=(16, 16, 16), *, axis: int = -1, sequence: int = 5) -> onnx.ModelProto:
    """The projections as qkv_bias_merge leaves them: one MatMul by [Wq | Wk | Wv], one
    Add, a Split (the form BERT has by the round attention ran in)."""
    rng = np.random.default_rng(12)
    width = sum(sizes)
    inits = {
        "w": rng.standard_normal((16, width)) / 4,
        "b": rng.standard_normal(width),
        "sizes": np.array(sizes, np.int64),
    }
    rows = sequence if axis == -1 else sizes[0]
    mask = np.zeros((2, 1, rows, rows))
    mask[0, :, :, rows - 1 :] = -10000.0
    inits["mask"] = mask
    text = f"""<ir_version: 10, opset_import: ["" : 17, "com.microsoft" : 1]>
    g (float[2, {sequence}, 16] x) => (float[2, {rows}, ?] y) {{
        m = MatMul (x, w)
        p = Add (m, b)
        q, k, v = Split <axis = {axis}> (p, sizes)
        y = com.microsoft.MultiHeadAttention <num_heads = 4> (q, k, v, , , mask)
    }}"""
    return build_model(text, inits)


def test_projections_merged_first_become_one_attention():
    model = merged_model()
    fused, node = the_packed_attention(model, "attention_packed_merged")
    assert [a.name for a in node.attribute] == ["num_heads"]  # MHA's default scale, kept
    run_both(model, fused, **TOL)


def test_a_merged_split_that_is_not_three_equal_parts_is_a_near_miss():
    model = merged_model((16, 16, 8))
    result = optimize_packed(model)
    assert "attention_packed_merged" not in result.counts
    assert any("three equal parts" in r for r in misses(result, "attention_packed_merged"))
    run_both(model, result.to_proto(), **TOL)


def test_a_merged_split_on_another_axis_is_a_near_miss():
    # x[2, 48, 16]: the Split cuts the sequence axis into three [2, 16, 48] parts
    model = merged_model(axis=1, sequence=48)
    result = optimize_packed(model)
    assert "attention_packed_merged" not in result.counts
    assert any("not on the last axis" in r for r in misses(result, "attention_packed_merged"))
    run_both(model, result.to_proto(), **TOL)


@pytest.mark.parametrize("name", ["bert_eager_dynamo", "bert_eager_torchscript"])
def test_a_bert_export_is_packed_after_the_default_merge(name: str):
    """End to end, in the order the defaults run: attention and qkv_bias_merge in
    round 1, then the packed Attention over the merged projection in round 2."""
    # the default profile (cpu), the CLI's and the service's
    config = OptimizeConfig(target="onnxruntime", check=CheckOptions(rtol=0.0, atol=1e-4))
    result = optimize(TRANSFORMERS / f"{name}.onnx", config)
    assert result.check is not None and result.check.passed, result.check
    assert result.counts.get("attention_packed_merged") == 2, result.near_misses
    assert result.ops_after[ATTENTION] == 2
    assert "com.microsoft::MultiHeadAttention" not in result.ops_after
