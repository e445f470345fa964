"""The numerical check: compare_models and the sessions it runs."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.parser
import pytest

import fusion_core.validate._compare as compare_module
from fusion_core.validate import compare_models, make_session, random_inputs


def _model(body: str, out: str = "float[2,3] y") -> onnx.ModelProto:
    return onnx.parser.parse_model(
        '<ir_version: 8, opset_import: ["" : 17]>\n'
        f"g (float[2,3] x, int64[2] ids) => ({out}) {{\n {body}\n}}"
    )


IDENTITY = _model("y = Relu(x)")


def test_identical_models_pass_with_zero_difference() -> None:
    result = compare_models(IDENTITY, IDENTITY, rtol=0.0, atol=0.0, samples=3)
    assert result.passed and result.error is None
    assert result.max_abs_diff == 0.0
    assert [o.name for o in result.outputs] == ["y"]


def test_a_small_change_fails_and_is_measured() -> None:
    changed = _model("c = Constant<value = float {0.001}>()\n r = Relu(x)\n y = Add(r, c)")
    result = compare_models(IDENTITY, changed, rtol=0.0, atol=1e-4)
    assert not result.passed
    (output,) = result.outputs
    assert output.max_abs_diff == pytest.approx(1e-3, rel=1e-3)
    assert "exceeds atol" in output.detail
    assert compare_models(IDENTITY, changed, rtol=0.0, atol=1e-2).passed


def test_shape_mismatch_fails() -> None:
    other = _model("y = Flatten<axis = 0>(x)", out="float[1,6] y")
    result = compare_models(IDENTITY, other)
    assert not result.passed
    assert "shape" in result.outputs[0].detail


def test_unloadable_model_is_an_error_not_a_crash() -> None:
    broken = _model("y = NoSuchOp(x)")
    result = compare_models(IDENTITY, broken)
    assert not result.passed
    assert result.error is not None and "could not load" in result.error


def test_random_inputs_are_seeded_and_typed() -> None:
    a = random_inputs(IDENTITY, seed=5)
    b = random_inputs(IDENTITY, seed=5)
    assert set(a) == {"x", "ids"}
    assert a["x"].dtype == np.float32 and a["ids"].dtype == np.int64
    np.testing.assert_array_equal(a["x"], b["x"])
    assert not np.array_equal(a["x"], random_inputs(IDENTITY, seed=6)["x"])


def test_session_for_a_model_over_the_protobuf_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    # Pretend the limit is tiny: the session must be built from a file with external
    # data, and the caller's model must keep its weights.
    model = onnx.load("tests/data/resnet/resnet50_w8_torchscript.onnx")
    size = model.ByteSize()
    monkeypatch.setattr(compare_module, "PROTOBUF_LIMIT_BYTES", 1000)
    big = make_session(model)
    monkeypatch.undo()
    small = make_session(model)
    x = np.random.default_rng(0).standard_normal((1, 3, 32, 32)).astype(np.float32)
    np.testing.assert_allclose(
        big.run(None, {"input": x})[0], small.run(None, {"input": x})[0], rtol=0, atol=0
    )
    assert model.ByteSize() == size
