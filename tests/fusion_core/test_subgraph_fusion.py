"""Fusion inside If/Loop/Scan bodies: the matcher and rewriters work per graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize

RTOL, ATOL = 1e-3, 1e-4
RNG = np.random.default_rng(11)
C = 4


def _conv_bn_relu_body(name: str, prefix: str) -> onnx.GraphProto:
    """A branch that computes Relu(BN(Conv(x))); its weights are the branch's own."""
    nodes = [
        oh.make_node("Conv", ["x", f"{prefix}w"], [f"{prefix}c"], pads=[1, 1, 1, 1]),
        oh.make_node(
            "BatchNormalization",
            [f"{prefix}c", f"{prefix}g", f"{prefix}b", f"{prefix}m", f"{prefix}v"],
            [f"{prefix}n"],
        ),
        oh.make_node("Relu", [f"{prefix}n"], [f"{prefix}y"]),
    ]
    params = {
        "w": RNG.normal(0, 0.3, (C, 3, 3, 3)),
        "g": RNG.uniform(0.5, 1.5, C),
        "b": RNG.normal(0, 0.2, C),
        "m": RNG.normal(0, 0.2, C),
        "v": RNG.uniform(0.5, 2.0, C),
    }
    inits = [
        onnx.numpy_helper.from_array(np.asarray(a, np.float32), f"{prefix}{k}")
        for k, a in params.items()
    ]
    out = oh.make_tensor_value_info(f"{prefix}y", onnx.TensorProto.FLOAT, [1, C, 8, 8])
    return oh.make_graph(nodes, name, [], [out], initializer=inits)


def _if_model() -> onnx.ModelProto:
    node = oh.make_node(
        "If",
        ["cond"],
        ["y"],
        then_branch=_conv_bn_relu_body("then_g", "t_"),
        else_branch=_conv_bn_relu_body("else_g", "e_"),
    )
    graph = oh.make_graph(
        [node],
        "g",
        [
            oh.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
            oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 8, 8]),
        ],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, C, 8, 8])],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    return model


def _body_ops(result) -> list[list[str]]:
    if_node = next(n for n in result.model.graph if n.op_type == "If")
    return [
        [f"{n.domain}::{n.op_type}" if n.domain else n.op_type for n in b.as_graph()]
        for b in (if_node.attributes["then_branch"], if_node.attributes["else_branch"])
    ]


@pytest.mark.parametrize(
    ("target", "expected_ops"),
    [("generic", ["Conv", "Relu"]), ("onnxruntime", ["com.microsoft::FusedConv"])],
    ids=["generic", "onnxruntime"],
)
def test_both_branches_of_an_if_fuse(target, expected_ops):
    config = OptimizeConfig(target=target, check=CheckOptions(rtol=RTOL, atol=ATOL))
    x = RNG.normal(0, 1, (1, 3, 8, 8)).astype(np.float32)
    both_branches = [{"cond": np.array(flag), "x": x} for flag in (True, False)]
    result = optimize(_if_model(), config, feeds=both_branches)
    assert result.counts == {"conv_bn_relu": 2}
    assert _body_ops(result) == [expected_ops, expected_ops]
    assert result.check is not None and result.check.passed, result.check.error
    assert result.check.max_abs_diff <= ATOL
    fused = result.to_proto()
    if target == "generic":
        onnx.checker.check_model(fused, full_check=True)
