"""autofusion.fusion_core.testing: the builders make what they say, the assertions can fail."""

from __future__ import annotations

import onnx.numpy_helper as nh
import pytest

from autofusion.fusion_core.testing import (
    assert_fusion,
    assert_no_fusion,
    conv_bn_relu,
    optimize_quiet,
    run_both,
)

RTOL, ATOL = 1e-5, 1e-5


def test_conv_bn_relu_fuses_and_passes_the_four_checks() -> None:
    model = conv_bn_relu(prefix="a/", seed=3)
    assert [n.name for n in model.graph.node] == ["a/conv", "a/bn", "a/relu"]
    result = optimize_quiet(model, patterns=["conv_bn_relu"])
    assert_fusion(model, result, counts={"conv_bn_relu": 1}, ops=["Conv", "Relu"], rtol=RTOL,
                  atol=ATOL)  # fmt: skip


def test_a_symbolic_batch_is_kept() -> None:
    model = conv_bn_relu(batch="N")
    assert model.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"


def test_the_statistics_are_not_an_identity() -> None:
    arrays = {i.name: nh.to_array(i) for i in conv_bn_relu().graph.initializer}
    assert abs(arrays["gamma"] - 1).max() > 0.05 and abs(arrays["mean"]).max() > 0.01


def test_a_wrong_fusion_fails_on_the_numbers() -> None:
    model = conv_bn_relu()
    fused = optimize_quiet(model, patterns=["conv_bn_relu"]).to_proto()
    weight = next(i for i in fused.graph.initializer if len(i.dims) == 4)
    weight.CopyFrom(nh.from_array(nh.to_array(weight) * 1.01, weight.name))  # off by 1%
    with pytest.raises(AssertionError, match="y"):
        run_both(model, fused, rtol=RTOL, atol=ATOL)


def test_wrong_counts_and_ops_fail() -> None:
    model = conv_bn_relu()
    result = optimize_quiet(model, patterns=["conv_bn_relu"])
    with pytest.raises(AssertionError, match="counts"):
        assert_fusion(model, result, counts={"conv_bn_relu": 2}, ops=["Conv", "Relu"],
                      rtol=RTOL, atol=ATOL)  # fmt: skip
    with pytest.raises(AssertionError, match="ops"):
        assert_fusion(model, result, counts={"conv_bn_relu": 1}, ops=["Conv"], rtol=RTOL,
                      atol=ATOL)  # fmt: skip


def test_a_pattern_that_did_not_fire_names_its_reason() -> None:
    model = conv_bn_relu()
    result = optimize_quiet(model, patterns=["conv_add_relu"])
    with pytest.raises(AssertionError, match="not in"):
        assert_no_fusion(
            model,
            result,
            pattern="conv_add_relu",
            reason="no such reason",
            ops=["Conv", "BatchNormalization", "Relu"],
            rtol=RTOL,
            atol=ATOL,
        )
