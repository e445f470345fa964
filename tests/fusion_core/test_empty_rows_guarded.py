"""A finite mask's rows with nothing to attend to take the values' mean only when the
mask has such a row (``fusion_core/rewriters/_empty_rows_guard.py``): the mean sits in
an ``If`` whose condition reads the mask alone, so a decode step (whose query, a real
token, always attends to itself) does not read the value cache for it.

The block is test_group_query_attention.py's eager decoder attention (float32's lowest
as the masked value), with a cache. A row is empty where the causal window of its query
holds only masked keys: left padding reaching into the new tokens, or random holes.

Tolerance: rtol = atol = 1e-5 (the kernel sums in another order: about 1e-6 measured).
A wrong fix (the mean skipped, or applied to every row) is off by more than 1e-2.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.testing import op_sequence, optimize_quiet, run_both
from tests.fusion_core.rewriters.test_group_query_attention import (
    ORT,
    TOL,
    decoder_attention,
    feeds,
)

pytest.importorskip("onnxruntime")

LOWEST = float(np.finfo(np.float32).min)


def _fused(target: str = "onnxruntime", **block) -> tuple[onnx.ModelProto, onnx.ModelProto]:
    model = decoder_attention(eager=True, lowest=LOWEST, **block)
    extra = {"upgrade_opset": 23} if target == "generic" else {}
    result = optimize_quiet(model, target=target, exclude=ORT["exclude"], **extra)
    assert result.counts.get("attention") == 1, result.counts
    fused = result.to_proto()
    onnx.checker.check_model(fused, full_check=True)
    return model, fused


@pytest.fixture(scope="module")
def fused_ort() -> tuple[onnx.ModelProto, onnx.ModelProto]:
    return _fused()


def _has_empty_row(sample: dict[str, np.ndarray], past: int) -> bool:
    """A query row whose causal window (keys up to its own) is all padding."""
    mask, seq = sample["attention_mask"], sample["x"].shape[1]
    return any(not mask[b, : past + s + 1].any() for b in range(len(mask)) for s in range(seq))


def _guard(fused: onnx.ModelProto) -> onnx.NodeProto:
    (guard,) = [n for n in fused.graph.node if n.op_type == "If"]
    return guard


def _branch_ops(guard: onnx.NodeProto, name: str) -> list[str]:
    return [n.op_type for n in onnx.helper.get_node_attr_value(guard, name).node]


def _max_diff(original: onnx.ModelProto, fused: onnx.ModelProto, sample: dict) -> float:
    import onnxruntime

    outs = [
        onnxruntime.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, sample
        )[0]
        for m in (original, fused)
    ]
    return float(np.abs(outs[0] - outs[1]).max())


def _with_guard(fused: onnx.ModelProto, *, condition: bool | None = None, fix=None):
    """A copy of ``fused`` whose If reads a constant ``condition`` (True: the kernel's
    output, the mean skipped) or whose else-branch (the fix) is ``fix``."""
    broken = onnx.ModelProto()
    broken.CopyFrom(fused)
    guard = _guard(broken)
    if condition is not None:
        name = "constant_condition"
        broken.graph.initializer.append(onnx.numpy_helper.from_array(np.array(condition), name))
        guard.input[0] = name
    if fix is not None:
        (attr,) = [a for a in guard.attribute if a.name == "else_branch"]
        attr.g.CopyFrom(fix)
    return broken


def _poisoned(fix: onnx.GraphProto) -> onnx.GraphProto:
    """A fix that writes 1e3 everywhere, shaped like the kernel's output it reads."""
    where = fix.node[-1]  # Where(keep, attention, mean)
    assert where.op_type == "Where", where
    big = onnx.helper.make_tensor("poison", onnx.TensorProto.FLOAT, [], [1e3])
    nodes = [
        onnx.helper.make_node("Shape", [where.input[1]], ["poison_shape"]),
        onnx.helper.make_node("Constant", [], ["poison_value"], value=big),
        onnx.helper.make_node("Expand", ["poison_value", "poison_shape"], [where.output[0]]),
    ]
    return onnx.helper.make_graph(nodes, fix.name, [], list(fix.output))


def test_the_mean_is_read_only_inside_the_guard(fused_ort):
    _, fused = fused_ort
    ops = op_sequence(fused)
    assert "ReduceMean" not in ops and ops.count("If") == 1, ops
    guard = _guard(fused)
    assert _branch_ops(guard, "then_branch") == ["Identity"]
    fix = _branch_ops(guard, "else_branch")
    assert fix == ["ReduceMean", "Unsqueeze", "Expand", "Reshape", "Where"], fix


@pytest.mark.parametrize(
    "shape", [(2, 4, 0, "left"), (2, 3, 4, "random"), (3, 1, 1, "random")], ids=str
)
def test_an_empty_row_still_gets_the_mean(fused_ort, shape):
    """Against onnxruntime running the unfused block; the input has an empty row."""
    model, fused = fused_ort
    batch, seq, past, mask = shape
    sample = feeds(batch, seq, past, mask)
    if mask == "random":  # make sure: the first batch's keys all masked
        sample["attention_mask"][0] = 0
    assert _has_empty_row(sample, past)
    run_both(model, fused, feeds=sample, **TOL)


@pytest.mark.parametrize(
    "shape", [(2, 1, 7, "left"), (2, 1, 7, "none"), (2, 3, 4, "left"), (1, 4, 0, "right")], ids=str
)
def test_no_empty_row_passes_the_kernel_output_through(fused_ort, shape):
    """Decode steps and prefills without an empty row: equal to the unfused block, and
    the fix is not what gives it (a fix that writes 1e3 everywhere changes nothing)."""
    model, fused = fused_ort
    batch, seq, past, mask = shape
    sample = feeds(batch, seq, past, mask)
    assert not _has_empty_row(sample, past)
    run_both(model, fused, feeds=sample, **TOL)
    fix = onnx.helper.get_node_attr_value(_guard(fused), "else_branch")
    poisoned = _poisoned(fix)
    run_both(model, _with_guard(fused, fix=poisoned), feeds=sample, **TOL)
    # and the poisoned fix does run where a row is empty: the guard is what skips it
    empty = feeds(2, 4, 0, "left")
    assert _max_diff(model, _with_guard(fused, fix=poisoned), empty) > 1e2


def test_skipping_the_mean_wrongly_fails(fused_ort):
    """The check above can fail: with the mean always skipped (the guard's condition
    constant True), an empty row is the causal kernel's, not the graph's, by far."""
    model, fused = fused_ort
    sample = feeds(2, 4, 0, "left")
    assert _max_diff(model, fused, sample) < 1e-4
    assert _max_diff(model, _with_guard(fused, condition=True), sample) > 1e-2


@settings(max_examples=25, deadline=None)
@given(
    batch=st.integers(1, 3),
    seq=st.integers(1, 4),
    past=st.integers(0, 5),
    bits=st.integers(0, 2**32 - 1),
)
def test_random_masks_match_the_unfused_block(fused_ort, batch, seq, past, bits):
    """Any padding (the check's random bits, which leave empty rows or not)."""
    model, fused = fused_ort
    sample = feeds(batch, seq, past, "none")
    total = past + seq
    holes = np.random.default_rng(bits).integers(0, 2, (batch, total)).astype(np.int64)
    sample["attention_mask"] = holes
    run_both(model, fused, feeds=sample, **TOL)


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
def test_generic_attention_guards_its_mean_too(cache):
    """ONNX Attention (opset 23) gives 0 to a row of the lowest everywhere; its mean is
    guarded the same way, the condition read from the bias."""
    model, fused = _fused("generic", cache=cache)
    ops = op_sequence(fused)
    assert ops.count("If") == 1 and "ReduceMean" not in ops, ops
    assert "ReduceMean" in _branch_ops(_guard(fused), "else_branch")
    for batch, seq, past, mask in ((2, 4, 3, "left"), (2, 1, 7, "left"), (1, 4, 0, "none")):
        sample = feeds(batch, seq, past if cache else 0, mask, cache=cache)
        if mask == "left":
            sample["attention_mask"][-1, : seq + (past if cache else 0) - 1] = 0
        run_both(model, fused, feeds=sample, **TOL)
    if cache:
        empty = feeds(2, 4, 0, "left")
        assert _max_diff(model, _with_guard(fused, condition=True), empty) > 1e-2
