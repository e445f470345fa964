"""The mask applied again after the Softmax (CPM-Ant) read as SDPA's NaN guard.

CPM-Ant writes ``P = Where(c, 0, Softmax(Where(c, -inf, s)))`` with one condition ``c``
for both Wheres (``fusion_core/canonical/_mask_guard.py``: rule ``mask_guard``). A
generator (hypothesis) writes one attention block drawing how the condition is spelled
(``allowed == False``, ``Not(allowed)``, ``allowed`` itself, the comparison computed
twice), how the fill is spelled (a masked_fill of the scores or a Where added to them),
how the zeroing after the Softmax is spelled (``Where(c, 0, P)``, ``Where(allowed, P,
0)``, ``Where(Not(allowed), 0, P)``, ``Mul(P, Cast(allowed, float))``), the fill (-inf
or float32's lowest), CPM-Ant's position bias (a Gather from a constant table) or none,
rows with no key or not, heads, lengths and head size. Every block must fuse into one
MultiHeadAttention and compute what the original computes, rows with no key (0 in the
graph) included. Tolerance: rtol = atol = 1e-5, as for the other attention tests (the
kernel sums in another order; the outputs differ by about 1e-6 at these sizes).

The near misses: a zeroing by another condition, or by the same one read the other way
(it zeroes what the Softmax gave weight to), is no guard; a bias that is a graph input
may hold -inf, so MultiHeadAttention is refused with that reason. The example budget is
``AUTOFUSION_SPELLING_EXAMPLES`` (25 in ``make test``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto
from onnx import helper as oh
from onnx import numpy_helper as nh

from autofusion.fusion_core.canonical import undo_unused
from autofusion.fusion_core.testing import canonical_twice, fuse_quiet, run_both
from autofusion.fusion_core.validate import make_session
from tests.fusion_core.spelling_settings import SPELLINGS

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = dict(rtol=1e-5, atol=1e-5)
LOWEST = float(np.finfo(np.float32).min)
BUCKETS = 16
F32 = TensorProto.FLOAT


@dataclass(frozen=True)
class Case:
    condition: str  # "equal_false", "not", "allowed", "twice": how c is computed
    fill: str  # "masked_fill" of the scores or "added" Where(allowed, 0, negative)
    zeroing: str  # "where", "swapped", "not", "mul"; "nan": SDPA's Where(IsNaN(P), 0, P)
    infinite: bool  # -inf, else float32's lowest
    bias: bool  # CPM-Ant's position bias, Transpose(Gather(table, buckets))
    empty_rows: bool  # some query rows have no key
    heads: int
    length: int
    size: int
    batch: int = 1


def _blocked(case: Case, nodes: list, tag: str) -> tuple[str, bool]:
    """The condition's value and whether True masks (``blocked``)."""
    if case.condition == "allowed":
        return "allowed", False
    if case.condition == "not":
        nodes.append(oh.make_node("Not", ["allowed"], [f"blocked{tag}"]))
    else:  # equal_false, and twice: one more Equal for the zeroing
        nodes.append(oh.make_node("Equal", ["allowed", "false"], [f"blocked{tag}"]))
    return f"blocked{tag}", True


def _fill(case: Case, nodes: list, cond: str, blocked: bool) -> None:
    """scores -> filled (the Softmax's input)."""
    if case.fill == "masked_fill":
        sides = ["negative", "scores"] if blocked else ["scores", "negative"]
        nodes.append(oh.make_node("Where", [cond, *sides], ["filled"]))
        return
    sides = ["negative", "zero"] if blocked else ["zero", "negative"]
    nodes.append(oh.make_node("Where", [cond, *sides], ["mask"]))
    nodes.append(oh.make_node("Add", ["scores", "mask"], ["filled"]))


def _zeroing(case: Case, nodes: list, cond: str, blocked: bool) -> None:
    """probs -> guarded, zeroed where the condition masks (``nan``: SDPA's own guard)."""
    if case.zeroing == "nan":
        nodes.append(oh.make_node("IsNaN", ["probs"], ["is_nan"]))
        nodes.append(oh.make_node("Where", ["is_nan", "zero", "probs"], ["guarded"]))
        return
    if case.zeroing == "mul":
        allowed = cond
        if blocked:
            nodes.append(oh.make_node("Not", [cond], ["allowed_again"]))
            allowed = "allowed_again"
        nodes.append(oh.make_node("Cast", [allowed], ["allowed_f"], to=F32))
        nodes.append(oh.make_node("Mul", ["probs", "allowed_f"], ["guarded"]))
        return
    if case.zeroing == "not":  # Where(Not(allowed), 0, P): the blocked side by a Not
        if blocked:
            nodes.append(oh.make_node("Not", [cond], ["allowed_again"]))
            cond, blocked = "allowed_again", False
        nodes.append(oh.make_node("Not", [cond], ["blocked_again"]))
        cond, blocked = "blocked_again", True
    elif case.zeroing == "swapped" and blocked:
        nodes.append(oh.make_node("Not", [cond], ["allowed_again"]))
        cond, blocked = "allowed_again", False
    elif case.zeroing == "where" and not blocked:
        nodes.append(oh.make_node("Not", [cond], ["blocked_again"]))
        cond, blocked = "blocked_again", True
    sides = ["zero", "probs"] if blocked else ["probs", "zero"]
    nodes.append(oh.make_node("Where", [cond, *sides], ["guarded"]))


def build(case: Case, *, zeroing_cond: str | None = None, bias_input: bool = False):
    """The block: q, k, v [B, S, N * H], allowed [B, 1, S, S] bool (and buckets [B, S, S]
    or the bias [B, N, S, S] itself) -> y [B, S, N * H]. ``zeroing_cond`` names another
    boolean input that the zeroing reads instead (a near miss)."""
    n, s, h, b = case.heads, case.length, case.size, case.batch
    table = np.random.default_rng(7).standard_normal((BUCKETS, n)).astype(np.float32)
    inits = [
        nh.from_array(np.array([0, 0, n, h], np.int64), "heads"),
        nh.from_array(np.array([0, 0, n * h], np.int64), "merged"),
        nh.from_array(np.array(1 / np.sqrt(h), np.float32), "scale"),
        nh.from_array(np.array(-np.inf if case.infinite else LOWEST, np.float32), "negative"),
        nh.from_array(np.array(0.0, np.float32), "zero"),
        nh.from_array(np.array(False), "false"),
        nh.from_array(table, "table"),
    ]
    nodes = []
    for x, perm in (("q", [0, 2, 1, 3]), ("k", [0, 2, 3, 1]), ("v", [0, 2, 1, 3])):
        nodes.append(oh.make_node("Reshape", [x, "heads"], [f"{x}4"]))
        nodes.append(oh.make_node("Transpose", [f"{x}4"], [f"{x}h"], perm=perm))
    nodes += [
        oh.make_node("MatMul", ["qh", "kh"], ["qk"]),
        oh.make_node("Mul", ["qk", "scale"], ["scaled"]),
    ]
    if case.bias and not bias_input:
        nodes.append(oh.make_node("Gather", ["table", "buckets"], ["gathered"]))
        nodes.append(oh.make_node("Transpose", ["gathered"], ["bias"], perm=[0, 3, 1, 2]))
    nodes.append(
        oh.make_node(
            "Add" if case.bias else "Identity", ["scaled", "bias"][: 1 + case.bias], ["scores"]
        )
    )
    cond, blocked = _blocked(case, nodes, "")
    _fill(case, nodes, cond, blocked)
    nodes.append(oh.make_node("Softmax", ["filled"], ["probs"], axis=-1))
    if zeroing_cond is not None:
        cond, blocked = zeroing_cond, False
    elif case.condition == "twice":
        cond, blocked = _blocked(case, nodes, "_twice")
    _zeroing(case, nodes, cond, blocked)
    nodes += [
        oh.make_node("MatMul", ["guarded", "vh"], ["ctx"]),
        oh.make_node("Transpose", ["ctx"], ["ctx_t"], perm=[0, 2, 1, 3]),
        oh.make_node("Reshape", ["ctx_t", "merged"], ["y"]),
    ]
    inputs = [oh.make_tensor_value_info(x, F32, [b, s, n * h]) for x in "qkv"]
    inputs.append(oh.make_tensor_value_info("allowed", TensorProto.BOOL, [b, 1, s, s]))
    if zeroing_cond is not None:
        inputs.append(oh.make_tensor_value_info(zeroing_cond, TensorProto.BOOL, [b, 1, s, s]))
    if case.bias and bias_input:
        inputs.append(oh.make_tensor_value_info("bias", F32, [b, n, s, s]))
    elif case.bias:
        inputs.append(oh.make_tensor_value_info("buckets", TensorProto.INT64, [b, s, s]))
    graph = oh.make_graph(
        nodes, "mask_after_softmax", inputs, [oh.make_tensor_value_info("y", F32, [b, s, n * h])]
    )
    graph.initializer.extend(i for i in inits if case.bias and not bias_input or i.name != "table")
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 18)])
    onnx.checker.check_model(model, full_check=True)
    return model


def feeds(case: Case, model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    b, s, e = case.batch, case.length, case.heads * case.size
    allowed = rng.random((b, 1, s, s)) < 0.6
    allowed[..., np.arange(s), rng.integers(0, s, s)] = True  # every row has a key...
    if case.empty_rows:  # ...but these
        allowed[..., rng.random(s) < 0.4, :] = False
        allowed[..., 0, :] = False
    x = {name: rng.standard_normal((b, s, e)).astype(np.float32) for name in "qkv"}
    x["allowed"] = allowed
    names = {i.name for i in model.graph.input}
    if "buckets" in names:
        x["buckets"] = rng.integers(0, BUCKETS, (b, s, s), dtype=np.int64)
    if "bias" in names:
        x["bias"] = rng.standard_normal((b, case.heads, s, s)).astype(np.float32)
    if "other" in names:
        x["other"] = rng.random((b, 1, s, s)) < 0.5
    return x


@st.composite
def cases(draw) -> Case:
    return Case(
        condition=draw(st.sampled_from(["equal_false", "not", "allowed", "twice"])),
        fill=draw(st.sampled_from(["masked_fill", "added"])),
        zeroing=draw(st.sampled_from(["where", "swapped", "not", "mul", "nan"])),
        infinite=draw(st.booleans()),
        bias=draw(st.booleans()),
        empty_rows=draw(st.booleans()),
        heads=draw(st.sampled_from([1, 2, 4])),
        length=draw(st.integers(1, 7)),
        size=draw(st.sampled_from([4, 8])),
        batch=draw(st.integers(1, 2)),
    )


def _fused_ops(fused) -> list[str]:
    return [op for op in fused.ops if op in ("MultiHeadAttention", "Softmax", "IsNaN", "If")]


@SPELLINGS
@given(case=cases())
def test_the_mask_after_the_softmax_fuses_once_and_computes_the_same(case: Case) -> None:
    model = build(case)
    fused = fuse_quiet(model)
    assert fused.result.counts == {"attention": 1}, (case, fused.misses_about("attention"))
    assert _fused_ops(fused) == ["MultiHeadAttention"], (case, fused.ops)
    onnx.checker.check_model(fused.model, full_check=True)
    for seed in range(3):
        run_both(model, fused.model, feeds=feeds(case, model, seed), **TOL)


CPM_ANT = Case("equal_false", "masked_fill", "where", True, True, True, 4, 6, 8)


def test_cpm_ant_empty_rows_give_zero_after_fusing() -> None:
    """The case the rule is for, with a row that has no key: 0 there, as the graph gives
    (the rows to keep multiply MultiHeadAttention's output)."""
    fused = fuse_quiet(build(CPM_ANT))
    x = feeds(CPM_ANT, fused.model)
    x["allowed"][..., 2, :] = False
    (y,) = make_session(fused.model).run(None, x)
    size = CPM_ANT.heads * CPM_ANT.size
    assert np.array_equal(y[:, 2], np.zeros((1, size), np.float32))
    run_both(build(CPM_ANT), fused.model, feeds=x, **TOL)


@pytest.mark.parametrize(
    "zeroing", ["where", "swapped", "mul"], ids=["where", "swapped", "mul_by_cast"]
)
def test_a_zeroing_by_another_condition_is_no_guard(zeroing: str) -> None:
    """A zeroing by a condition other than the fill's zeroes entries the Softmax gave
    weight to: read as the guard it would give another answer. Nothing fuses, and the
    model computes what it did."""
    case = Case("equal_false", "masked_fill", zeroing, True, True, False, 2, 5, 4)
    model = build(case, zeroing_cond="other")
    fused = fuse_quiet(model)
    assert "attention" not in fused.result.counts
    assert any("found" in m for m in fused.misses_about("attention")), fused.misses_about(
        "attention"
    )
    assert "IsNaN" not in fused.ops
    run_both(model, fused.model, feeds=feeds(case, model), rtol=0, atol=0)


def test_the_same_condition_read_the_other_way_is_no_guard() -> None:
    """``Where(allowed, 0, P)`` after ``Where(allowed, s, -inf)`` zeroes the keys the
    Softmax attends to: the same tensor, the other polarity."""
    case = Case("allowed", "masked_fill", "where", True, False, False, 2, 5, 4)
    model = build(case)
    for node in model.graph.node:  # the zeroing Where(Not(allowed), 0, P) reads allowed
        if node.output[0] == "guarded":
            node.input[0] = "allowed"
    fused = fuse_quiet(model)
    assert "attention" not in fused.result.counts and "IsNaN" not in fused.ops
    run_both(model, fused.model, feeds=feeds(case, model), rtol=0, atol=0)


def test_a_bias_that_is_a_graph_input_is_refused_with_the_reason() -> None:
    """A bias the graph takes as an input may hold -inf. Under SDPA's guard a row it
    alone masks fully is NaN, then 0, and MultiHeadAttention with the keep factor of the
    mask's condition would give it the average of the masked keys: the rewriter says
    why it stops, and the model computes what it did (0 on that row)."""
    for zeroing in ("nan", "where"):
        case = Case("equal_false", "masked_fill", zeroing, True, True, True, 2, 5, 4)
        model = build(case, bias_input=True)
        fused = fuse_quiet(model)
        assert "attention" not in fused.result.counts
        reasons = " ".join(fused.misses_about("attention"))
        assert "not proven free of -inf (the graph input 'bias')" in reasons, reasons
        x = feeds(case, model)
        x["bias"][..., 1, :] = -np.inf  # a row the bias alone masks
        run_both(model, fused.model, feeds=x, **TOL)


def test_a_finite_fill_no_fusion_took_is_put_back() -> None:
    """The rule writes the lowest fill as -inf and the zeroing as the guard; where no
    fusion takes them both go back: the fill's constant is the lowest again, and the
    zeroing reads the condition."""
    case = Case("equal_false", "masked_fill", "where", False, False, True, 2, 4, 4)
    model = build(case)
    _, done, again, work = canonical_twice(model)
    assert done.get("mask_guard") == 1 and again == 0
    guarded = ir.to_proto(work)
    assert [n.op_type for n in guarded.graph.node].count("IsNaN") == 1
    assert undo_unused(work.graph)["mask_guard"] == 1
    restored = ir.to_proto(work)
    ops = [n.op_type for n in restored.graph.node]
    assert "IsNaN" not in ops and ops.count("Where") == 2, ops
    fills = [
        nh.to_array(i) for i in restored.graph.initializer if i.name.startswith("mask_guard_minus")
    ]
    assert fills == [np.array(LOWEST, np.float32)], fills
    onnx.checker.check_model(restored, full_check=True)
    run_both(model, restored, feeds=feeds(case, model), rtol=0, atol=0)


def test_a_finite_fill_read_elsewhere_stays() -> None:
    """The probabilities of a finite fill also a graph output: a uniform row would
    become NaN there, so the rule leaves the block."""
    case = Case("equal_false", "masked_fill", "where", False, False, True, 2, 4, 4)
    model = build(case)
    model.graph.output.append(oh.make_tensor_value_info("probs", F32, None))
    _, done, _, _ = canonical_twice(model)
    assert "mask_guard" not in done
