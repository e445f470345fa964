"""Rule ``buffer_mask``: a causal or banded mask sliced from a constant buffer
(GPT-Neo's ``bias[:, :, P : P + S, : P + S]``) is computed from key and query indices,
with the same value wherever the original graph runs (``P + S <= N``)."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import onnx.numpy_helper
import onnx_ir as ir
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from autofusion.fusion_core.canonical import RULES, canonical_form, undo_unused
from autofusion.fusion_core.testing import canonical_twice, op_sequence, optimize_quiet, run_both

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples


def _buffer(n: int, window: int | None) -> np.ndarray:
    i, j = np.indices((n, n))
    allowed = (j <= i) & (j > i - window) if window else j <= i
    return allowed.reshape(1, 1, n, n)


def _model(
    n: int, window: int | None, heads: int, *, exported: bool = False, bound: int | None = None
) -> onnx.ModelProto:
    """masked_fill of the scores [1, heads, S, P + S] by the buffer's slice, spelled as
    torch.export writes it (start ``Shape(past)[2]``, end ``P + S``); ``exported``: the
    output's sizes labeled as torch.export carries them from the slice (Max, Min);
    ``bound``: the end spelled ``P + Max(0, -P + Min(bound, P + S))`` (GPT-Neo's local
    layers, with ``bound`` its buffer's size n)."""
    out_rows, out_keys = "S", "P + S"
    if exported:
        out_rows, out_keys = f"Max(0, -P + Min({n}, P + S))", f"Min({n}, P + S)"
    i64 = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [len(v)], v)  # noqa: E731
    end = [helper.make_node("Add", ["p", "s"], ["end"])]
    if bound is not None:
        end = [
            helper.make_node("Add", ["p", "s"], ["total"]),
            helper.make_node("Min", ["bound", "total"], ["low"]),
            helper.make_node("Mul", ["minus_one", "p"], ["minus_p"]),
            helper.make_node("Add", ["minus_p", "low"], ["diff"]),
            helper.make_node("Max", ["zero", "diff"], ["kept"]),
            helper.make_node("Add", ["p", "kept"], ["end"]),
        ]
    nodes = [
        helper.make_node("Shape", ["past"], ["p"], start=2, end=3),
        helper.make_node("Shape", ["scores_in"], ["s"], start=2, end=3),
        *end,
        helper.make_node("Slice", ["bias", "p", "end", "two", "one"], ["rows"]),
        helper.make_node("Slice", ["rows", "zero", "end", "three", "one"], ["mask"]),
        helper.make_node("Where", ["mask", "scores_in", "fill"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["probs"], axis=-1),
    ]
    inits = [
        helper.make_tensor("bias", TensorProto.BOOL, [1, 1, n, n], _buffer(n, window).ravel()),
        i64("zero", [0]), i64("one", [1]), i64("two", [2]), i64("three", [3]),
        helper.make_tensor("fill", TensorProto.FLOAT, [], [float(np.finfo(np.float32).min)]),
    ]  # fmt: skip
    if bound is not None:
        inits += [i64("minus_one", [-1]), i64("bound", [bound])]
    graph = helper.make_graph(
        nodes,
        "buffer_mask",
        [
            helper.make_tensor_value_info("scores_in", TensorProto.FLOAT, [1, heads, "S", "P + S"]),
            helper.make_tensor_value_info("past", TensorProto.FLOAT, [1, heads, "P", 4]),
        ],
        [helper.make_tensor_value_info("probs", TensorProto.FLOAT, [1, heads, out_rows, out_keys])],
        inits,
        value_info=[
            helper.make_tensor_value_info("masked", TensorProto.FLOAT, [1, heads, "S", "P + S"])
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _rewritten(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """``model`` with the rule alone applied, through ``canonical_form`` (the others
    disabled); how often it applied."""
    graph_model = ir.serde.deserialize_model(onnx.shape_inference.infer_shapes(model))
    names = itertools.count()
    others = [name for name in RULES if name != "buffer_mask"]
    done = canonical_form(graph_model.graph, lambda s: f"{s}_{next(names)}", disabled=others)
    return ir.serde.serialize_model(graph_model), done["buffer_mask"]


def _run(model: onnx.ModelProto, scores: np.ndarray, past: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"scores_in": scores, "past": past})[0]


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(2, 24),
    window=st.one_of(st.none(), st.integers(1, 23)),
    heads=st.integers(1, 3),
    clamped=st.booleans(),
    data=st.data(),
)
def test_buffer_slice_is_computed_mask(n, window, heads, clamped, data):
    """``clamped``: the end spelled ``P + Max(0, -P + Min(n, P + S))``, equal to ``P + S``
    as the end of a Slice over n rows (both clamp to n beyond it)."""
    window = window if window is None or window < n else None
    total = data.draw(st.integers(1, n), label="P + S")
    past_length = data.draw(st.integers(0, total - 1), label="P")
    seq = total - past_length
    model = _model(n, window, heads, bound=n if clamped else None)
    fused, done = _rewritten(model)
    assert done == 1  # on HEAD no rule reads the buffer's slice
    onnx.checker.check_model(fused, full_check=True)
    ops = [node.op_type for node in fused.graph.node]
    assert "Slice" not in ops and "LessOrEqual" in ops
    assert ("Greater" in ops) == (window is not None)
    mask = next(v for v in fused.graph.value_info if v.name.startswith("buffer_mask_"))
    assert mask is not None
    rng = np.random.default_rng(n * 1000 + total)
    scores = rng.standard_normal((1, heads, seq, total)).astype(np.float32)
    past = np.zeros((1, heads, past_length, 4), np.float32)
    np.testing.assert_allclose(_run(fused, scores, past), _run(model, scores, past), rtol=0, atol=0)


def test_an_end_clamped_below_the_buffer_is_left():
    """``P + Max(0, -P + Min(m, P + S))`` with ``m`` below the buffer's n rows is not
    ``P + S`` where ``m < P + S <= n``: the slice is left as it is."""
    _, done = _rewritten(_model(6, None, 1, bound=5))
    assert done == 0
    _, done = _rewritten(_model(6, None, 1, bound=6))
    assert done == 1


def test_other_buffer_is_left():
    """A buffer that is neither causal nor a band (its transpose) is no causal mask."""
    model = _model(6, None, 1)
    bias = next(t for t in model.graph.initializer if t.name == "bias")
    bias.CopyFrom(
        helper.make_tensor("bias", TensorProto.BOOL, [1, 1, 6, 6], _buffer(6, None)[0, 0].T.ravel())
    )
    _, done = _rewritten(model)
    assert done == 0


def _constants(model: onnx.ModelProto, names: set[str]) -> dict[str, list]:
    return {
        t.name: onnx.numpy_helper.to_array(t).tolist()
        for t in model.graph.initializer
        if t.name in names
    }


def _sizes(values) -> list[tuple[str, list]]:
    return [
        (v.name, [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]) for v in values
    ]


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(2, 12),
    window=st.one_of(st.none(), st.integers(1, 11)),
    heads=st.integers(1, 3),
    exported=st.booleans(),
    data=st.data(),
)
def test_a_mask_no_fusion_took_comes_back_as_it_went_in(n, window, heads, exported, data):
    """Nothing fuses: the two Slices of the buffer come back (their constants and names),
    and so do the output's size labels the rule wrote as S and P + S."""
    window = window if window is None or window < n else None
    model = _model(n, window, heads, exported=exported)
    _canonical, done, _again, work = canonical_twice(model)
    assert done.get("buffer_mask") == 1, done
    assert undo_unused(work.graph)["buffer_mask"] == 1
    undone = ir.to_proto(work)
    onnx.checker.check_model(undone, full_check=True)
    assert op_sequence(undone) == op_sequence(model)
    slices = [list(node.input) for node in undone.graph.node if node.op_type == "Slice"]
    assert slices == [list(node.input) for node in model.graph.node if node.op_type == "Slice"]
    read = {name for inputs in slices for name in inputs}
    assert _constants(undone, read) == _constants(model, read)  # mask_as_bias leaves its 0
    assert _sizes(undone.graph.output) == _sizes(model.graph.output)
    total = data.draw(st.integers(1, n), label="P + S")
    past_length = data.draw(st.integers(0, total - 1), label="P")
    rng = np.random.default_rng(n * 1000 + total)
    feeds = {
        "scores_in": rng.standard_normal((1, heads, total - past_length, total)).astype(np.float32),
        "past": np.zeros((1, heads, past_length, 4), np.float32),
    }
    run_both(model, undone, feeds=feeds, rtol=0, atol=0)
    # through the whole optimizer, no attention pattern among those tried: nothing fuses
    result = optimize_quiet(model, target="onnxruntime", patterns=["gelu_tanh"])
    assert op_sequence(result.to_proto()) == op_sequence(model), result.prepasses
    run_both(model, result.to_proto(), feeds=feeds, rtol=0, atol=0)
