"""A generic target's re-emitted tail is not fused a second time.

On ``generic``, ``conv_bn_add_relu`` folds the BatchNormalization into the Conv and emits
the residual Add and the Relu again (the target has no fused op for them). A block whose
two branches are each a Conv + BatchNormalization into the same Add (a ResNet's downsample
block) used to have its tail taken twice: the tail pattern in round 1 on one branch and,
since rewrites type what they make, again in round 2 on the other, through the re-emitted
Add and Relu. The report counted two tails for one block and the second fusion's
provenance listed the first one's four originals twice (pipeline/reemitted.py).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import onnx_ir as ir
import pytest

from autofusion.fusion_core import OptimizeConfig, optimize, provenance, testing
from autofusion.fusion_core.catalog import builtin_patterns, compile_pattern
from autofusion.fusion_core.ir import model_from_proto
from autofusion.fusion_core.pipeline.reemitted import reemitted
from autofusion.fusion_core.rewriters import AppliedRewrite

_F32 = onnx.TensorProto.FLOAT


def _two_branch_block(seed: int = 0) -> onnx.ModelProto:
    """``relu(bn_a(conv_a(x)) + bn_b(conv_b(x)))``: a ResNet block's tail, its residual
    the downsample branch (a 1x1 Conv + BatchNormalization), nodes named."""
    rng = np.random.default_rng(seed)
    arrays = {
        "wa": rng.normal(0, 0.3, (8, 4, 3, 3)),
        "wb": rng.normal(0, 0.3, (8, 4, 1, 1)),
        **testing.bn_params(rng, 8, "a"),
        **testing.bn_params(rng, 8, "b"),
    }

    def bn(branch: str) -> onnx.NodeProto:
        params = [f"{branch}_{p}" for p in ("scale", "bias", "mean", "var")]
        return oh.make_node(
            "BatchNormalization", [f"c{branch}", *params], [f"n{branch}"], name=f"bn_{branch}"
        )

    nodes = [
        oh.make_node("Conv", ["x", "wa"], ["ca"], name="conv_a", pads=[1, 1, 1, 1]),
        bn("a"),
        oh.make_node("Conv", ["x", "wb"], ["cb"], name="conv_b"),
        bn("b"),
        oh.make_node("Add", ["na", "nb"], ["s"], name="add"),
        oh.make_node("Relu", ["s"], ["y"], name="relu"),
    ]
    graph = oh.make_graph(
        nodes,
        "two_branch_block",
        [oh.make_tensor_value_info("x", _F32, [1, 4, 6, 6])],
        [oh.make_tensor_value_info("y", _F32, [1, 8, 6, 6])],
        [nh.from_array(a.astype(np.float32), name) for name, a in arrays.items()],
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize("target", ["generic", "onnxruntime"])
def test_one_block_credits_one_tail_and_folds_the_other_branch(target: str) -> None:
    # Before: generic counted {"conv_bn_add_relu": 2} (the same 4 ops), onnxruntime as now.
    model = _two_branch_block()
    result = testing.optimize_quiet(model, target=target)
    assert result.counts == {"conv_bn_add_relu": 1, "conv_bn": 1}
    want = ["Conv", "Conv", "Add", "Relu"] if target == "generic" else ["Conv", "FusedConv"]
    fused = result.to_proto()
    assert sorted(n.op_type for n in fused.graph.node) == sorted(want)
    # folded BatchNormalization: float32 rounding of W*s and (b-mean)*s+beta only
    testing.run_both(model, fused, rtol=1e-5, atol=1e-5)


def test_each_fused_node_lists_its_own_originals_once() -> None:
    # Before: the round-2 tail's three nodes (conv_b, add, relu) each listed conv_b, bn_b,
    # then conv_a, bn_a, add, relu twice (10 names, 4 repeated), as if conv_b replaced both.
    result = testing.optimize_quiet(_two_branch_block(), target="generic")
    listed = {
        n.name: provenance.replaced_nodes(provenance.metadata(n))
        for n in result.to_proto().graph.node
    }
    tail = ["conv_a", "bn_a", "add", "relu"]
    assert listed == {"conv_a": tail, "add": tail, "relu": tail, "conv_b": ["conv_b", "bn_b"]}


def _applied(old: list[ir.Node], new: list[ir.Node]) -> AppliedRewrite:
    return AppliedRewrite(
        ir.Graph([], [], nodes=[]), new, [(n, tuple(n.inputs)) for n in old], [], []
    )


def test_only_a_node_recreated_as_it_was_counts_as_reemitted() -> None:
    graph = model_from_proto(_two_branch_block()).graph
    conv, bn, _, _, add, relu = list(graph)
    folded_w = ir.Value(name="folded_w")
    attrs = [ir.Attr(a.name, a.type, a.value) for a in conv.attributes.values()]
    conv2 = ir.Node("", "Conv", [conv.inputs[0], folded_w], attrs)  # folded: new work
    add2 = ir.Node("", "Add", [conv2.outputs[0], add.inputs[1]])
    relu2 = ir.Node("", "Relu", [add2.outputs[0]])
    leaky = ir.Node("", "LeakyRelu", [add2.outputs[0]])  # another op: new work
    assert reemitted(_applied([conv, bn, add, relu], [conv2, add2, relu2, leaky])) == [
        add2,
        relu2,
    ]
    # an Add that reads something other than what the removed one read is new work too
    other = ir.Node("", "Add", [conv2.outputs[0], conv.inputs[0]])
    assert reemitted(_applied([conv, bn, add], [conv2, other])) == []


ADD_RELU_REGION = {
    "name": "add_relu_region",
    "priority": 1,  # below conv_bn_add_relu's 40: it takes what that one re-emits
    "nodes": [{"id": "add", "op": "Add"}, {"id": "act", "op": "Relu", "inputs": {0: "add"}}],
    "rewriter": {"name": "fused_region", "params": {"domain": "ai.test"}},
}


def test_a_fusion_of_two_nodes_of_one_earlier_fusion_lists_its_originals_once() -> None:
    # Another pattern may take the re-emitted Add and Relu; both stand for the tail's four
    # originals. Before: the region listed conv_a, bn_a, add, relu twice (8 names).
    patterns = [
        *(p for p in builtin_patterns() if p.name == "conv_bn_add_relu"),
        compile_pattern(ADD_RELU_REGION),
    ]
    config = OptimizeConfig(target="generic", check={"enabled": False})
    result = optimize(_two_branch_block(), config, patterns=patterns)
    assert result.counts == {"conv_bn_add_relu": 1, "add_relu_region": 1}
    (region,) = [n for n in result.to_proto().graph.node if n.domain == "ai.test"]
    props = provenance.metadata(region)
    assert provenance.replaced_nodes(props) == ["conv_a", "bn_a", "add", "relu"]
    values = provenance.replaced_values(props)  # and the re-emitted Add's own output
    assert values[:3] == ["ca", "na", "s"] and len(set(values)) == len(values)
