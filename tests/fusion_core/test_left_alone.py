"""What no rule rewrites is kept as it is, and the report says so (``left_alone``)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize

RTOL, ATOL = 1e-3, 1e-4


def _qdq_silu() -> onnx.ModelProto:
    """x * Sigmoid(x) between a DequantizeLinear and a QuantizeLinear: a QDQ unit."""
    text = """<ir_version: 8, opset_import: ["" : 17, "ai.custom" : 1]>
    g (uint8[1, 8] xq) => (uint8[1, 8] yq, float[1, 8] z) {
        x = DequantizeLinear(xq, scale, zero)
        s = Sigmoid(x)
        m = Mul(x, s)
        yq = QuantizeLinear(m, scale, zero)
        z = ai.custom.Mystery(x)
    }"""
    model = onnx.parser.parse_model(text)
    model.graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.array(0.05, np.float32), "scale"),
            onnx.numpy_helper.from_array(np.array(128, np.uint8), "zero"),
        ]
    )
    return model


def _plain_silu() -> onnx.ModelProto:
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[1, 8] x) => (float[1, 8] m) {
        s = Sigmoid(x)
        m = Mul(x, s)
    }"""
    return onnx.parser.parse_model(text)


def test_a_qdq_unit_is_not_fused_and_the_reason_names_it():
    config = OptimizeConfig(target="onnxruntime", check=CheckOptions(enabled=False))
    result = optimize(_qdq_silu(), config)
    assert result.counts == {}
    ops = [n.op_type for n in result.model.graph]
    assert ops == ["DequantizeLinear", "Sigmoid", "Mul", "QuantizeLinear", "Mystery"]
    (miss,) = [m for m in result.near_misses if m.pattern == "silu"]
    assert "DequantizeLinear" in miss.reason and "QDQ" in miss.reason
    records = {r["what"]: r for r in result.left_alone}
    assert records["quantized ops"]["nodes"] == 2
    assert records["domain ai.custom"]["nodes"] == 1


def test_the_same_chain_outside_a_qdq_unit_fuses():
    config = OptimizeConfig(target="onnxruntime", check=CheckOptions(rtol=RTOL, atol=ATOL))
    result = optimize(_plain_silu(), config)
    assert result.counts == {"silu": 1}
    assert result.check is not None and result.check.passed
    assert result.left_alone == []


def test_the_renderings_say_what_was_left_alone():
    from autofusion.fusion_core.report import (
        build_report,
        format_markdown,
        format_summary,
        render_html,
    )

    config = OptimizeConfig(target="onnxruntime", check=CheckOptions(enabled=False))
    report = build_report(optimize(_qdq_silu(), config), config=config)
    assert report["left_alone"][0]["what"] == "domain ai.custom"
    assert "left alone: quantized ops (2 nodes)" in format_summary(report)
    assert "| quantized ops | 2 |" in format_markdown(report)
    assert 'id="left-alone"' in render_html(report) and "domain ai.custom" in render_html(report)
