"""fusion_core.testing: the builders make what they say, the assertion can fail."""

from __future__ import annotations

import onnx
import onnx.numpy_helper as nh
import pytest

from fusion_core import OptimizeConfig, optimize
from fusion_core.testing import assert_fused, conv_bn_relu, op_counts

RTOL, ATOL = 1e-5, 1e-5


def _fused(model: onnx.ModelProto) -> onnx.ModelProto:
    return optimize(model, OptimizeConfig(check={"enabled": False})).to_proto()


def test_conv_bn_relu_fuses_and_passes_the_four_checks() -> None:
    model = conv_bn_relu(prefix="a/", batch="N", seed=3)
    assert [n.name for n in model.graph.node] == ["a/conv", "a/bn", "a/relu"]
    assert_fused(
        model,
        _fused(model),
        fused_ops={"Conv": 1},
        replaced_ops=["BatchNormalization"],
        rtol=RTOL,
        atol=ATOL,
        dims={"N": 2},
    )


def test_the_statistics_are_not_an_identity() -> None:
    arrays = {i.name: nh.to_array(i) for i in conv_bn_relu().graph.initializer}
    assert abs(arrays["gamma"] - 1).max() > 0.05 and abs(arrays["mean"]).max() > 0.01


def test_a_wrong_fusion_fails_on_the_numbers() -> None:
    model = conv_bn_relu()
    fused = _fused(model)
    weight = next(i for i in fused.graph.initializer if nh.to_array(i).ndim == 4)
    weight.CopyFrom(nh.from_array(nh.to_array(weight) * 1.01, weight.name))  # off by 1%
    with pytest.raises(AssertionError, match="output y"):
        assert_fused(model, fused, fused_ops={"Conv": 1}, rtol=RTOL, atol=ATOL)


def test_missing_and_leftover_ops_fail() -> None:
    model = conv_bn_relu()
    with pytest.raises(AssertionError, match="fused op counts"):
        assert_fused(model, _fused(model), fused_ops={"Conv": 2}, rtol=RTOL, atol=ATOL)
    with pytest.raises(AssertionError, match="still there"):
        assert_fused(model, model, fused_ops={"Conv": 1}, replaced_ops=["Relu"], rtol=RTOL,
                     atol=ATOL)  # fmt: skip
    assert op_counts(model) == {"Conv": 1, "BatchNormalization": 1, "Relu": 1}
