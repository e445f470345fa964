"""``packed_attention`` (onnxruntime, optional pattern): Q/K/V projections of one input
+ com.microsoft.MultiHeadAttention -> com.microsoft.Attention with the packed weight.

The graph is one BERT self-attention in small: x[2, 5, 16], 4 heads of 4, weights
drawn N(0, 1/4), biases N(0, 1), an additive mask [2, 1, 5, 5] that blocks the last
two keys of the second row. Tolerance: rtol = atol = 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from fusion_core.catalog import parse_pattern_text
from fusion_core.testing import build_model, misses, op_sequence, optimize_quiet, run_both

TOL = dict(rtol=1e-5, atol=1e-5)
PATTERN_FILE = (
    Path(__file__).resolve().parents[3] / "fusion_core/patterns/optional/attention_packed.yaml"
)
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
    patterns = parse_pattern_text(PATTERN_FILE.read_text(), str(PATTERN_FILE))
    return optimize_quiet(model, target="onnxruntime", extra_patterns=patterns)


def test_qkv_projections_and_multi_head_attention_become_one_attention():
    model = attention_model()
    result = optimize_packed(model)
    assert result.counts == {"attention_packed": 1}
    fused = result.to_proto()
    assert op_sequence(fused) == [ATTENTION]
    onnx.checker.check_model(fused, full_check=True)
    (node,) = fused.graph.node
    weights = {i.name: onnx.numpy_helper.to_array(i) for i in fused.graph.initializer}
    assert weights[node.input[1]].shape == (16, 48) and weights[node.input[2]].shape == (48,)
    assert list(node.input)[3:] == ["", "", "mask"] and node.input[0] == "x"
    run_both(model, fused, **TOL)


def test_it_is_not_a_default():
    result = optimize_quiet(attention_model(), target="onnxruntime")
    assert "attention_packed" not in result.counts


def test_unequal_projections_are_a_near_miss():
    model = attention_model(v_out=8)
    result = optimize_packed(model)
    assert "attention_packed" not in result.counts
    assert any("differ in shape" in r for r in misses(result, "attention_packed"))
    run_both(model, result.to_proto(), **TOL)


def test_the_generic_target_has_no_packed_attention():
    patterns = parse_pattern_text(PATTERN_FILE.read_text(), str(PATTERN_FILE))
    result = optimize_quiet(attention_model(), target="generic", extra_patterns=patterns)
    assert "attention_packed" not in result.counts
    assert op_sequence(result.to_proto()).count("com.microsoft::MultiHeadAttention") == 1
