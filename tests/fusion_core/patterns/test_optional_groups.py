"""Optional groups (``optional: <group>``, ``through: k``): one pattern for a block whose
spelling may leave steps out. The generator writes chains of blocks with random steps
present and asserts that each block is one candidate, bound whole, with the groups it has.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.catalog import compile_pattern
from autofusion.fusion_core.cost import load_target_profile
from autofusion.fusion_core.errors import PatternError
from autofusion.fusion_core.patterns import Matcher, PatternSpec

# MatMul (of a Relu of q, optionally: a group at the edge, whose absence lets $q bind
# the Relu's output, so the smaller variant binds a subset of the block), then
# optionally a scale (Mul by a constant), a mask (Add) and a guard Where(IsNaN(p), 0, p)
# around a Softmax, then MatMul by v.
BLOCK = {
    "name": "block",
    "nodes": [
        {"id": "relu", "op": "Relu", "inputs": {0: "$q"}, "optional": "relu"},
        {"id": "qk", "op": "MatMul", "inputs": {0: "relu", 1: "$k"}},
        {"id": "scale", "op": "Mul", "inputs": {0: "qk"}, "optional": "scale"},
        {"id": "mask", "op": "Add", "inputs": {0: "scale", 1: "$mask"}, "optional": "mask"},
        {"id": "softmax", "op": "Softmax", "inputs": {0: "mask"}},
        {"id": "is_nan", "op": "IsNaN", "inputs": {0: "softmax"}, "optional": "guard"},
        {
            "id": "guard",
            "op": "Where",
            "inputs": {0: "is_nan", 2: "softmax"},
            "optional": "guard",
            "through": 2,
        },
        {"id": "context", "op": "MatMul", "inputs": {0: "guard", 1: "$v"}},
    ],
    "constraints": [
        {"kind": "constant", "values": ["scale.in1"]},
        {"kind": "constant", "values": ["guard.in1"]},
        {"kind": "dtype", "values": ["$mask"], "in": ["FLOAT"]},
    ],
    "rewriter": {"name": "fused_region", "params": {"domain": "ai.test"}},
}
GROUPS = ("relu", "scale", "mask", "guard")


def _chain(blocks: list[set[str]]) -> tuple[onnx.ModelProto, list[list[str]]]:
    """Blocks one after the other (each block's output is the next one's q), each with
    the steps named; the node names each block has, in the pattern's order."""
    nodes, inits, expected = [], [], []
    x = "x"
    for b, steps in enumerate(blocks):
        names = []
        if "relu" in steps:
            nodes.append(oh.make_node("Relu", [x], [f"r{b}"], name=f"relu{b}"))
            x, names = f"r{b}", [f"relu{b}"]
        names.append(f"qk{b}")
        nodes.append(oh.make_node("MatMul", [x, "k"], [f"s{b}"], name=f"qk{b}"))
        scores = f"s{b}"
        if "scale" in steps:
            inits.append(onnx.numpy_helper.from_array(np.array(0.5, np.float32), f"c{b}"))
            nodes.append(oh.make_node("Mul", [scores, f"c{b}"], [f"m{b}"], name=f"scale{b}"))
            scores, names = f"m{b}", [*names, f"scale{b}"]
        if "mask" in steps:
            nodes.append(oh.make_node("Add", [scores, "bias"], [f"a{b}"], name=f"mask{b}"))
            scores, names = f"a{b}", [*names, f"mask{b}"]
        nodes.append(oh.make_node("Softmax", [scores], [f"p{b}"], name=f"softmax{b}"))
        probs, names = f"p{b}", [*names, f"softmax{b}"]
        if "guard" in steps:
            inits.append(onnx.numpy_helper.from_array(np.array(0.0, np.float32), f"z{b}"))
            nodes.append(oh.make_node("IsNaN", [probs], [f"n{b}"], name=f"is_nan{b}"))
            nodes.append(
                oh.make_node("Where", [f"n{b}", f"z{b}", probs], [f"g{b}"], name=f"guard{b}")
            )
            probs, names = f"g{b}", [*names, f"is_nan{b}", f"guard{b}"]
        nodes.append(oh.make_node("MatMul", [probs, "v"], [f"y{b}"], name=f"context{b}"))
        expected.append([*names, f"context{b}"])
        x = f"y{b}"
    square = [
        oh.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [4, 4])
        for n in ("x", "k", "v", "bias")
    ]
    out = oh.make_tensor_value_info(x, onnx.TensorProto.FLOAT, [4, 4])
    graph = oh.make_graph(nodes, "chain", square, [out], inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)]), expected


def _find(model: onnx.ModelProto, spec: PatternSpec):
    return Matcher([spec]).find(ir.from_proto(model).graph)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sets(st.sampled_from(GROUPS)), min_size=1, max_size=4))
def test_each_block_is_one_candidate_with_the_steps_it_has(blocks) -> None:
    model, expected = _chain(blocks)
    result = _find(model, PatternSpec.model_validate(BLOCK))
    assert sorted(m.node_names() for m in result.candidates) == sorted(expected)
    by_qk = {m.node("qk").name: m for m in result.candidates}
    for b, steps in enumerate(blocks):
        match = by_qk[f"qk{b}"]
        assert set(match.pattern.groups) == steps
        # the variant's params and constraints name only what the block has
        assert all(node_id in match.nodes for node_id in ("qk", "softmax", "context"))
        assert ("guard" in match.nodes) == ("guard" in steps)
    assert not result.near_misses, result.near_misses


def test_a_group_whose_constraint_fails_is_a_near_miss_not_a_smaller_block() -> None:
    """A guard Where(IsNaN(p), x, p) with x not a constant: the guarded variant fails its
    constraint, and the unguarded one cannot bind past the Where to the MatMul."""
    model, _ = _chain([{"guard"}])
    where = next(n for n in model.graph.node if n.op_type == "Where")
    where.input[1] = "bias"
    result = _find(model, PatternSpec.model_validate(BLOCK))
    assert not result.candidates
    (miss,) = result.near_misses
    assert "guard.in1" in miss.reason and "constant" in miss.reason


def test_variants_drop_what_names_an_absent_group() -> None:
    spec = PatternSpec.model_validate(BLOCK)
    variants = spec.variants()
    assert len(variants) == 16 and variants[0].groups == GROUPS and variants[-1].groups == ()
    bare = variants[-1]
    assert [n.id for n in bare.nodes] == ["qk", "softmax", "context"]
    assert bare.node("qk").inputs == {0: "$q", 1: "$k"}
    assert bare.node("softmax").inputs == {0: "qk"} and bare.node("context").inputs[0] == "softmax"
    assert bare.constraints == []  # scale.in1, guard.in1 and $mask were the groups'
    assert all(v.name == "block" for v in variants)


def test_rewriter_params_naming_an_absent_node_are_none() -> None:
    compiled = compile_pattern(
        {
            "name": "attention_like",
            "priority": 1,
            "nodes": [
                {"id": "q_reshape", "op": "Reshape", "inputs": {0: "$q"}},
                {"id": "q_t", "op": "Transpose", "inputs": {0: "q_reshape"}},
                {"id": "k_t", "op": "Transpose", "inputs": {0: "$k"}},
                {"id": "qk", "op": "MatMul", "inputs": {0: "q_t", 1: "k_t"}},
                {"id": "scale", "op": "Mul", "inputs": {0: "qk"}},
                {"id": "mask", "op": "Add", "inputs": {0: "scale", 1: "$m"}, "optional": "mask"},
                {"id": "softmax", "op": "Softmax", "inputs": {0: "mask"}},
                {"id": "context", "op": "MatMul", "inputs": {0: "softmax", 1: "$v"}},
                {"id": "out_t", "op": "Transpose", "inputs": {0: "context"}},
                {"id": "out_reshape", "op": "Reshape", "inputs": {0: "out_t"}},
            ],
            "rewriter": {"name": "attention_block", "params": {"mask_node": "mask"}},
        }
    )
    full, bare = compiled.spec.variants()
    assert compiled.params_for(full).mask_node == "mask"
    assert compiled.params_for(bare).mask_node is None


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({5: {"through": 1}}, "nodes.5.through", "has no input 1"),
        ({4: {"optional": "mask"}}, "explain.node", "is optional"),
    ],
)
def test_a_group_that_cannot_be_left_out_is_refused_at_registration(change, field, words):
    raw = {**BLOCK, "nodes": [dict(n) for n in BLOCK["nodes"]]}
    raw["explain"] = {"node": "softmax", "when": "attention_softmax"}
    for index, update in change.items():
        raw["nodes"][index].update(update)
    with pytest.raises(PatternError) as caught:
        compile_pattern(raw)
    assert any(path == field and words in message for path, message in caught.value.errors), (
        caught.value.errors
    )


def test_more_than_five_groups_are_refused() -> None:
    raw = {
        "name": "many",
        "nodes": [{"id": "a", "op": "Relu", "inputs": {0: "$x"}}]
        + [
            {
                "id": f"n{k}",
                "op": "Relu",
                "inputs": {0: "a" if k == 0 else f"n{k - 1}"},
                "optional": f"g{k}",
            }
            for k in range(6)
        ],
        "rewriter": {"name": "fused_region", "params": {"domain": "ai.test"}},
    }
    with pytest.raises(PatternError) as caught:
        compile_pattern(raw)
    assert "at most 5" in str(caught.value.errors)


def test_a_target_profile_prices_one_group() -> None:
    cpu = load_target_profile("cpu")
    factors = dict(cpu.kernel_factors)
    assert factors["attention+softcap"] > 1
    assert (
        cpu.kernel_factor("attention_block", "attention", ("softcap",))
        == factors["attention+softcap"]
    )
    assert cpu.kernel_factor("attention_block", "attention", ("mask",)) == 1.0
