"""Rule ``blocked_projection``: q, k and v cut from one projection laid out in
model-parallel blocks (CodeGen: ``qkv.reshape(B, S, mp, 3 * c)`` split on the last axis)
become projections of their own, and the head split of each reads its projection.
Generated: blocks, parts and their sizes, Split by ``num_outputs`` or by sizes, the head
split's target constant or copying B and S. Values compared in onnxruntime with
optimizations off (rtol = atol = 1e-6: the same products, in GEMMs of other widths)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import canonical_twice, run_both

TOL = dict(rtol=1e-6, atol=1e-6)
HIDDEN, SEQ = 8, 3


def _model(
    blocks: int,
    sizes: list[int],
    *,
    by_sizes: bool,
    head: int,
    weight_input: bool = False,
    seed: int = 0,
) -> onnx.ModelProto:
    """x @ W viewed as [B, S, blocks, sum(sizes)], split on the last axis, each part
    reshaped into heads of ``head`` features and returned through a Neg."""
    rng = np.random.default_rng(seed)
    width = sum(sizes)
    inits = [
        onnx.numpy_helper.from_array(np.array([0, 0, blocks, width], np.int64), "view_shape"),
    ]
    inputs = [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["batch", SEQ, HIDDEN])]
    weight = rng.standard_normal((HIDDEN, blocks * width)).astype(np.float32)
    if weight_input:
        inputs.append(oh.make_tensor_value_info("w", onnx.TensorProto.FLOAT, weight.shape))
    else:
        inits.append(onnx.numpy_helper.from_array(weight, "w"))
    parts = [f"part{j}" for j in range(len(sizes))]
    nodes = [
        oh.make_node("MatMul", ["x", "w"], ["proj"]),
        oh.make_node("Reshape", ["proj", "view_shape"], ["view"]),
    ]
    if by_sizes:
        inits.append(onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes"))
        nodes.append(oh.make_node("Split", ["view", "sizes"], parts, axis=-1))
    else:
        nodes.append(oh.make_node("Split", ["view"], parts, axis=3, num_outputs=len(sizes)))
    outputs = []
    for j, size in enumerate(sizes):
        heads_shape = np.array([0, 0, blocks * size // head, head], np.int64)
        inits.append(onnx.numpy_helper.from_array(heads_shape, f"heads{j}"))
        nodes += [
            oh.make_node("Reshape", [parts[j], f"heads{j}"], [f"h{j}"]),
            oh.make_node("Neg", [f"h{j}"], [f"y{j}"]),
        ]
        outputs.append(oh.make_tensor_value_info(f"y{j}", onnx.TensorProto.FLOAT, None))
    graph = oh.make_graph(nodes, "blocked", inputs, outputs, inits)
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


def _feeds(model: onnx.ModelProto, seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    feeds = {"x": rng.standard_normal((2, SEQ, HIDDEN)).astype(np.float32)}
    if any(i.name == "w" for i in model.graph.input):
        feeds["w"] = rng.standard_normal((HIDDEN, 24)).astype(np.float32)
    return feeds


@settings(max_examples=30, deadline=None)
@given(
    blocks=st.sampled_from([2, 4]),
    sizes=st.sampled_from([[2, 2, 2], [4, 4, 4], [2, 4], [4, 2, 2]]),
    by_sizes=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_each_part_becomes_a_projection_of_its_own(blocks, sizes, by_sizes, seed) -> None:
    if len(set(sizes)) > 1:
        by_sizes = True  # unequal parts can only be given as sizes
    model = _model(blocks, sizes, by_sizes=by_sizes, head=2, seed=seed)
    fused, done, again, _ = canonical_twice(model)
    assert done.get("blocked_projection") == 1 and again == 0, done
    ops = _ops(fused)
    # one MatMul per part, each head split reading its projection: no Split, no view
    assert ops.count("MatMul") == len(sizes) and "Split" not in ops, ops
    assert ops.count("Reshape") == len(sizes), ops
    for node in fused.graph.node:
        if node.op_type == "Reshape":
            producer = {o: n for n in fused.graph.node for o in n.output}[node.input[0]]
            assert producer.op_type == "MatMul"
    run_both(model, fused, feeds=_feeds(model, seed), **TOL)


def test_one_block_is_already_contiguous_and_stays() -> None:
    model = _model(1, [2, 2, 2], by_sizes=False, head=2)
    _, done, _, _ = canonical_twice(model)
    assert "blocked_projection" not in done


def test_a_weight_the_caller_feeds_stays() -> None:
    """The columns of a graph input cannot be reordered ahead of time."""
    model = _model(4, [2, 2, 2], by_sizes=False, head=2, weight_input=True)
    fused, done, _, _ = canonical_twice(model)
    assert "blocked_projection" not in done and "Split" in _ops(fused)
    run_both(model, fused, feeds=_feeds(model), **TOL)


def test_a_head_split_copying_the_block_count_reads_the_projection_exactly() -> None:
    """``Reshape(part, [0, 0, 0, c])`` copies the block count from the 4-D part; the
    canonical form makes that copy the constant it is, and the head split then reads
    the 3-D projection: the values stay."""
    model = _model(4, [2, 2, 2], by_sizes=False, head=2)
    heads0 = next(i for i in model.graph.initializer if i.name == "heads0")
    heads0.CopyFrom(onnx.numpy_helper.from_array(np.array([0, 0, 0, 2], np.int64), "heads0"))
    fused, done, _, _ = canonical_twice(model)
    assert done.get("blocked_projection") == 1
    producer = {o: n for n in fused.graph.node for o in n.output}
    split = producer[producer["y0"].input[0]]  # the head split of part 0
    assert split.op_type == "Reshape" and producer[split.input[0]].op_type == "MatMul"
    run_both(model, fused, feeds=_feeds(model), **TOL)
