"""Every rewrite, canonical rule and pre-pass is a transaction (fusion_core/pipeline/
transaction.py): a step that raises, emits an op the model's opset lacks, writes types
that do not infer or makes a cycle is taken back alone, reported as a bug, and the run
goes on to a model that loads and matches the original.

The broken steps are rewriters registered for the test (the registry is how users add
code too) and rules or passes patched to raise; the model also holds a SiLU, which the
built-in pattern must still fuse around them.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.numpy_helper
import onnx.parser
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core import canonical
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.pipeline import optimize
from autofusion.fusion_core.prepasses import passes
from autofusion.fusion_core.rewriters import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    apply_rewrite,
    builtin_rewriters,
)
from autofusion.fusion_core.testing import build_model, run_both

TOL = {"rtol": 1e-5, "atol": 1e-6}

MODEL = """
<ir_version: 7, opset_import: ["" : 11]>
g (float[2, 8] x, float[2, 8] z) => (float[2, 8] y, float[2, 8] s) {
    a = Relu (x)
    b = Neg (a)
    c = Add (b, x)
    y = Sigmoid (c)
    g = Sigmoid (z)
    s = Mul (z, g)
}
"""


def _relu_neg(rewriter: str) -> dict:
    return {
        "name": f"test.{rewriter}",
        "description": "Relu then Neg, rewritten by a rewriter with a bug",
        "priority": 90,
        "targets": ["generic", "onnxruntime"],
        "nodes": [
            {"id": "relu", "op": "Relu", "inputs": {"0": "$x"}},
            {"id": "neg", "op": "Neg", "inputs": {"0": "relu"}},
        ],
        "rewriter": {"name": rewriter},
    }


class _Buggy(Rewriter):
    """Replaces Relu, Neg by what ``nodes`` builds from the match's input and output."""

    targets = frozenset({"generic", "onnxruntime"})

    def rewrite(self, match: Match, params: Params, ctx: RewriteContext) -> Rewrite:
        x = match.nodes["relu"].inputs[0]
        old = match.nodes["neg"].outputs[0]
        nodes = self.nodes(x, old)
        return Rewrite(nodes, [(old, nodes[-1].outputs[0])])

    def nodes(self, x: ir.Value, old: ir.Value) -> list[ir.Node]:
        raise NotImplementedError


class _Raises(_Buggy):
    name = "raises"

    def nodes(self, x, old):
        raise RuntimeError("a rewriter with a bug")


class _NewerOp(_Buggy):
    name = "newer_op"  # HardSwish exists from opset 14; the model imports 11

    def nodes(self, x, old):
        return [ir.Node("", "HardSwish", [x])]


class _UnknownAttribute(_Buggy):
    name = "unknown_attribute"  # Shape's start exists from opset 15

    def nodes(self, x, old):
        relu = ir.Node("", "Relu", [x], [ir.AttrInt64("start", 1)])
        return [relu, ir.Node("", "Neg", relu.outputs)]


class _WrongType(_Buggy):
    name = "wrong_type"  # says float, computes int64

    def nodes(self, x, old):
        cast = ir.Node("", "Cast", [x], [ir.AttrInt64("to", onnx.TensorProto.INT64)])
        return [cast]


class _Cycle(_Buggy):
    name = "cycle"  # reads c = Add(b, x), which reads what it replaces

    def nodes(self, x, old):
        reader = next(u.node for u in old.uses() if u.node.op_type == "Add")
        return [ir.Node("", "Neg", [reader.outputs[0]])]


BUGS = {
    "raises": ("RuntimeError", "a rewriter with a bug"),
    "newer_op": ("no op HardSwish", "opset 11"),
    "unknown_attribute": ("attribute(s) ['start'] do not exist", "Relu"),
    "wrong_type": ("infers as INT64", "FLOAT"),
    "cycle": ("cycle", "Add"),
}


def _registry():
    registry = builtin_rewriters()
    for cls in (_Raises, _NewerOp, _UnknownAttribute, _WrongType, _Cycle):
        registry.register(cls())
    return registry


def _optimize(model: onnx.ModelProto, target: str, **config):
    return optimize(
        model,
        OptimizeConfig(target=target, target_profile="cpu-roofline", **config),
        registry=_registry(),
    )


@pytest.mark.parametrize("target", ["generic", "onnxruntime"])
@pytest.mark.parametrize("bug", sorted(BUGS))
def test_a_rewrite_that_breaks_the_graph_is_taken_back_alone(bug: str, target: str) -> None:
    model = build_model(MODEL)
    result = _optimize(model, target, extra_patterns=[_relu_neg(bug)])

    [rejected] = result.rejected
    assert (rejected.step, rejected.name, rejected.kind) == ("rewrite", f"test.{bug}", "bug")
    assert set(rejected.nodes) == {"n0", "n1"} or len(rejected.nodes) == 2
    for words in BUGS[bug]:
        assert words in rejected.failed, rejected.failed
    assert not any(f.pattern == f"test.{bug}" for f in result.applied)
    misses = [m for m in result.near_misses if m.pattern == f"test.{bug}"]
    assert misses and all(m.kind == "bug" for m in misses), misses
    assert result.check is not None and result.check.passed, result.check
    fused = result.to_proto()
    ops = [n.op_type for n in fused.graph.node]
    assert ops.count("Relu") == 1 and ops.count("Neg") == 1, ops  # the match is as it was
    if target == "onnxruntime":  # and the rest still fused: x * Sigmoid(x) is QuickGelu
        assert "QuickGelu" in ops, ops
    onnx.checker.check_model(fused, full_check=True)
    run_both(model, fused, **TOL)


def test_a_rule_that_raises_is_left_out_and_the_run_starts_again(monkeypatch) -> None:
    calls = []

    def broken(graph, fresh_name, mark):
        calls.append(1)
        raise ValueError("a rule with a bug")

    monkeypatch.setitem(canonical.RULES, "known_scalars", broken)
    model = build_model(MODEL)
    result = _optimize(model, "onnxruntime")

    [rejected] = result.rejected
    assert (rejected.step, rejected.name) == ("canonical", "known_scalars")
    assert "ValueError" in rejected.failed and "a rule with a bug" in rejected.failed
    assert len(calls) == 1  # the second run leaves it out
    assert result.check.passed and result.counts.get("silu") == 1, result.counts
    run_both(model, result.to_proto(), **TOL)


def test_a_rule_that_writes_an_op_the_opset_lacks_is_left_out(monkeypatch) -> None:
    def newer(graph, fresh_name, mark):
        for node in list(graph):
            if node.op_type == "Relu" and not node.metadata_props.get("seen"):
                node.metadata_props["seen"] = "1"
                swish = ir.Node("", "HardSwish", [node.inputs[0]])
                graph.insert_before(node, swish)
                return 1
        return 0

    monkeypatch.setitem(canonical.RULES, "known_scalars", newer)
    result = _optimize(build_model(MODEL), "generic")

    [rejected] = result.rejected
    assert (rejected.step, rejected.name) == ("canonical", "known_scalars")
    assert "no op HardSwish" in rejected.failed
    assert "HardSwish" not in [n.op_type for n in result.to_proto().graph.node]
    assert result.check.passed


def test_a_prepass_that_raises_is_left_out(monkeypatch) -> None:
    def broken(self, model):
        raise KeyError("a pass with a bug")

    monkeypatch.setattr(passes.BroadcastingExpandPass, "call", broken)
    model = build_model(MODEL)
    result = _optimize(model, "onnxruntime")

    [rejected] = result.rejected
    assert (rejected.step, rejected.name) == ("pre-pass", "broadcasting_expand")
    assert "KeyError" in rejected.failed
    assert result.check.passed and result.counts.get("silu") == 1
    run_both(model, result.to_proto(), **TOL)


def test_a_prepass_that_writes_an_invalid_op_is_left_out(monkeypatch) -> None:
    real = passes.DropoutEliminationPass.call

    def invalid(self, model):
        real(self, model)
        first = next(iter(model.graph))
        bad = ir.Node("", "Shape", [model.graph.inputs[0]], [ir.AttrInt64("start", 1)])
        model.graph.insert_before(first, bad)
        return ir.passes.PassResult(model, modified=True)

    monkeypatch.setattr(passes.DropoutEliminationPass, "call", invalid)
    result = _optimize(build_model(MODEL), "generic")

    [rejected] = result.rejected
    assert (rejected.step, rejected.name) == ("pre-pass", "dropout_elimination")
    assert "['start'] do not exist for Shape at opset 11" in rejected.failed
    assert result.check.passed
    assert "Shape" not in [n.op_type for n in result.to_proto().graph.node]


def test_a_clean_run_rejects_nothing() -> None:
    result = _optimize(build_model(MODEL), "onnxruntime")
    assert result.rejected == [] and result.counts.get("silu") == 1


# Undo is exact: a random chain, a random run of it replaced (by ops reading any earlier
# value), then undone, serializes as it was.
_UNARY = ["Relu", "Neg", "Sigmoid", "Abs", "Exp"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(st.sampled_from([*_UNARY, "Add"]), min_size=3, max_size=10),
    data=st.data(),
)
def test_undo_puts_back_exactly_what_a_rewrite_changed(ops: list[str], data) -> None:
    lines, last = [], "x"
    for k, op in enumerate(ops):
        args = f"{last}, x" if op == "Add" else last
        lines.append(f"v{k} = {op} ({args})")
        last = f"v{k}"
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[3] x) => (float[3] {last}) {{
        {chr(10).join(lines)}
    }}
    """
    model = ir.serde.deserialize_model(build_model(text))
    model.graph.sort()
    before = ir.to_proto(model).SerializeToString()
    nodes = list(model.graph)
    start = data.draw(st.integers(0, len(nodes) - 1), label="start")
    end = data.draw(st.integers(start, len(nodes) - 1), label="end")
    matched = nodes[start : end + 1]
    old = matched[-1].outputs[0]
    ctx = RewriteContext(model, target=_target())
    ctx.positions = {id(n): k for k, n in enumerate(nodes)}
    match = _FakeMatch(matched)
    if data.draw(st.booleans(), label="to a value that was there"):  # renamed, retyped
        rewrite = Rewrite([], [(old, matched[0].inputs[0])])
    else:
        new = ir.Node("", "Abs", [matched[0].inputs[0]])
        rewrite = Rewrite([new], [(old, new.outputs[0])])
    applied = apply_rewrite(ctx, match, rewrite)
    assert matched[0].graph is None
    applied.undo()
    model.graph.sort()
    np.testing.assert_equal(ir.to_proto(model).SerializeToString(), before)


def _target():
    from autofusion.fusion_core.targets import get_target

    return get_target("generic")


class _FakeMatch:
    """What apply_rewrite reads of a match: its nodes, its pattern's name, no plumbing."""

    def __init__(self, nodes: list[ir.Node]) -> None:
        self.nodes = {f"n{k}": n for k, n in enumerate(nodes)}
        self.pattern = type("P", (), {"name": "test.undo"})()

    def shape_plumbing(self, new_nodes=()) -> list[ir.Node]:
        return []


def test_when_the_rounds_themselves_raise_the_model_comes_back_as_it_was(monkeypatch) -> None:
    """Matching is no one step that can be left out: the model comes back unfused and
    checked, with the failure as a rejection, never an exception."""
    from autofusion.fusion_core.patterns import Matcher

    def broken(self, graph):
        raise ZeroDivisionError("a matcher with a bug")

    monkeypatch.setattr(Matcher, "find", broken)
    model = build_model(MODEL)
    result = _optimize(model, "onnxruntime")

    [rejected] = result.rejected
    assert (rejected.step, rejected.name) == ("rounds", "rounds")
    assert "ZeroDivisionError" in rejected.failed and "a matcher with a bug" in rejected.failed
    assert result.applied == [] and result.check.passed
    fused = result.to_proto()
    assert [n.op_type for n in fused.graph.node] == [n.op_type for n in model.graph.node]


class _ReroutesBack(Rewriter):
    """Replaces Relu, Neg by ``c`` (a value their output feeds): no new node on the
    cycle, only the readers it moves."""

    name = "reroutes_back"
    targets = frozenset({"generic", "onnxruntime"})

    def rewrite(self, match: Match, params: Params, ctx: RewriteContext) -> Rewrite:
        old = match.nodes["neg"].outputs[0]
        reader = next(u.node for u in old.uses() if u.node.op_type == "Add")
        return Rewrite([], [(old, reader.outputs[0])])


def test_a_cycle_through_a_moved_reader_names_its_rewrite() -> None:
    registry = _registry()
    registry.register(_ReroutesBack())
    config = OptimizeConfig(
        target="generic", target_profile="cpu-roofline", extra_patterns=[_relu_neg("reroutes_back")]
    )
    model = build_model(MODEL)
    result = optimize(model, config, registry=registry)

    [rejected] = result.rejected
    assert (rejected.step, rejected.name) == ("rewrite", "test.reroutes_back")
    assert "cycle" in rejected.failed
    assert result.check.passed
    run_both(model, result.to_proto(), **TOL)


def test_constant_folding_and_its_lifting_are_one_step() -> None:
    """onnxscript writes folded shapes as Constant(value_ints), an attribute Constant has
    from opset 12; lifting makes them initializers right after. Checked as one step, an
    opset-11 model keeps its folding (the corpus's PP-OCR classifiers lost it to a
    rejection when each pass was checked alone)."""
    text = """<ir_version: 6, opset_import: ["" : 11]>
    g (float[1, 8] x) => (float[1, 2, 4] y) {
        s = Shape(w)
        one = Constant<value = int64[1] {1}>()
        t = Concat<axis = 0>(one, s)
        y = Reshape(x, t)
    }"""
    model = onnx.parser.parse_model(text)
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.zeros((2, 4), np.float32), "w"))
    result = optimize(model, OptimizeConfig())

    assert result.rejected == [], result.rejected
    assert {"constant_folding", "lift_constants"} <= set(result.prepasses)
    fused = result.to_proto()
    assert [n.op_type for n in fused.graph.node] == ["Reshape"]
    onnx.checker.check_model(fused, full_check=True)
    run_both(model, fused, rtol=0, atol=0)
