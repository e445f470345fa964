"""The generic target's onnx.checker verdict counts only what the rewrite introduced."""

from __future__ import annotations

import onnx
import onnx.parser
import pytest

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize


def _fails_full_check_as_shipped() -> onnx.ModelProto:
    """Declares y as [3] although Relu keeps x's [2]: strict shape inference refuses
    the model itself, while onnxruntime runs it (as onnx's node test test_mvn)."""
    text = """<ir_version: 8, opset_import: ["" : 17]>
    g (float[2] x) => (float[3] y) { y = Relu(x) }"""
    return onnx.parser.parse_model(text)


def test_a_problem_the_original_already_has_is_not_the_fusions():
    model = _fails_full_check_as_shipped()
    with pytest.raises(onnx.shape_inference.InferenceError):
        onnx.checker.check_model(model, full_check=True)
    result = optimize(model, OptimizeConfig(target="generic", check=CheckOptions(samples=1)))
    assert result.structure == []
