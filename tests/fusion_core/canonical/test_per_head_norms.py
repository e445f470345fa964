"""Rule ``per_head_norm``: StableLM's qk_layernorm (one LayerNorm with weights of its own
for each head, written as a Split of the heads, N LayerNormalizations and a Concat) as
one LayerNorm of every head and the heads' weights after it. Generated: head count,
head size, with or without biases, split by ``num_outputs`` or by sizes, after the head
Transpose or on any [B, N, S, H] value, and whether the whole block then fuses its
attention is the unseen-families survey's (docs/benchmarks.md section 22). Values are
compared in onnxruntime with optimizations off: rtol 1e-6, atol 1e-6 (the scale and
bias are applied after the normalization instead of inside the kernel)."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import canonical_twice, run_both

TOL = dict(rtol=1e-6, atol=1e-6)
B, S = 2, 3


def _model(
    heads: int,
    size: int,
    *,
    biases: bool,
    by_sizes: bool,
    transposed: bool,
    seed: int = 0,
    epsilons: list[float] | None = None,
    concat_axis: int = 1,
) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []
    x = "x"
    shape = [B, S, heads, size] if transposed else [B, heads, S, size]
    if transposed:
        nodes.append(oh.make_node("Transpose", ["x"], ["heads"], perm=[0, 2, 1, 3]))
        x = "heads"
    parts = [f"part{i}" for i in range(heads)]
    if by_sizes:
        inits.append(onnx.numpy_helper.from_array(np.ones(heads, np.int64), "sizes"))
        nodes.append(oh.make_node("Split", [x, "sizes"], parts, axis=1))
    else:
        nodes.append(oh.make_node("Split", [x], parts, axis=1, num_outputs=heads))
    normed = []
    for i, part in enumerate(parts):
        weight = rng.uniform(0.5, 1.5, size).astype(np.float32)
        inits.append(onnx.numpy_helper.from_array(weight, f"w{i}"))
        inputs = [part, f"w{i}"]
        if biases:
            inits.append(
                onnx.numpy_helper.from_array(rng.normal(size=size).astype(np.float32), f"b{i}")
            )
            inputs.append(f"b{i}")
        eps = (epsilons or [1e-5] * heads)[i]
        nodes.append(oh.make_node("LayerNormalization", inputs, [f"n{i}"], axis=-1, epsilon=eps))
        normed.append(f"n{i}")
    nodes.append(oh.make_node("Concat", normed, ["joined"], axis=concat_axis))
    nodes.append(oh.make_node("Relu", ["joined"], ["y"]))  # the block feeds on
    out_shape = [B, heads, S, size]
    if concat_axis != 1:
        out_shape = None
    graph = oh.make_graph(
        nodes,
        "per_head_norm",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, shape)],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, out_shape)],
        inits,
    )
    return oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])


def _ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@settings(max_examples=30, deadline=None)
@given(
    heads=st.integers(2, 8),
    size=st.sampled_from([4, 8, 16]),
    biases=st.booleans(),
    by_sizes=st.booleans(),
    transposed=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_per_head_norms_become_one_norm(heads, size, biases, by_sizes, transposed, seed):
    model = _model(heads, size, biases=biases, by_sizes=by_sizes, transposed=transposed, seed=seed)
    fused, done, again, _ = canonical_twice(model)
    assert done.get("per_head_norm") == 1 and again == 0, done
    ops = _ops(fused)
    assert ops.count("LayerNormalization") == 1 and "Split" not in ops and "Concat" not in ops
    # on the [B, S, N, H] projection, the head Transpose after the per-head ops
    assert ops.count("Transpose") == int(transposed)
    assert ops[-2] == ("Transpose" if transposed else "Add" if biases else "Mul")
    assert ("Add" in ops) == biases
    run_both(model, fused, seed=seed, **TOL)


@pytest.mark.parametrize(
    "change",
    [
        {"epsilons": [1e-5, 1e-6, 1e-5]},  # one head normalized otherwise
        {"concat_axis": 2},  # the heads joined along another axis
    ],
)
def test_look_alikes_stay(change) -> None:
    model = _model(3, 8, biases=True, by_sizes=False, transposed=False, **change)
    fused, done, _, _ = canonical_twice(model)
    assert "per_head_norm" not in done
    assert _ops(fused).count("LayerNormalization") == 3


def test_a_norm_read_elsewhere_stays() -> None:
    model = _model(3, 8, biases=False, by_sizes=False, transposed=False)
    model.graph.output.append(oh.make_tensor_value_info("n1", onnx.TensorProto.FLOAT, None))
    fused, done, _, _ = canonical_twice(model)
    assert "per_head_norm" not in done and _ops(fused).count("LayerNormalization") == 3


def test_a_concat_that_is_a_graph_output_stays() -> None:
    model = _model(3, 8, biases=False, by_sizes=False, transposed=False)
    model.graph.output.append(oh.make_tensor_value_info("joined", onnx.TensorProto.FLOAT, None))
    fused, done, _, _ = canonical_twice(model)
    assert "per_head_norm" not in done and _ops(fused).count("LayerNormalization") == 3


def test_heads_out_of_order_stay() -> None:
    """Concat(n1, n0, ...) puts head 1 first: not the heads in their order."""
    model = _model(3, 8, biases=False, by_sizes=False, transposed=False)
    concat = model.graph.node[-2]
    concat.input[0], concat.input[1] = concat.input[1], concat.input[0]
    fused, done, _, _ = canonical_twice(model)
    assert "per_head_norm" not in done
    run_both(model, fused, **TOL)
