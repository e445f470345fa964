"""A failed check falls back, and each broken fusion costs only itself
(fusion_core/pipeline/fallback.py, progressive.py, culprits.py).

The model is a chain of blocks: SiLUs the built-in pattern fuses (good), Relu then Neg
rewritten by a test rewriter into a Reshape onnxruntime refuses at run time (refused: 8n
values do not split into rows of 7; the graph loads, as BLT's GroupQueryAttention of a
query longer than its key did) and Abs then Neg rewritten as Abs alone (wrong values).
Whatever the order of the blocks and whichever stage the test patterns are in, the
fallback keeps every good fusion and its result matches the original. The nodes are
unnamed (ONNX text), as in many hand-built models: two broken blocks of one kind are
still two rollbacks, not one that takes both.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import onnx_ir as ir
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.pipeline import culprits, optimize
from autofusion.fusion_core.rewriters import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    builtin_rewriters,
)
from autofusion.fusion_core.testing import build_model, run_both
from autofusion.fusion_core.validate import FUSED_CANNOT_RUN
from tests.fusion_core.spelling_settings import EXAMPLES

pytestmark = pytest.mark.spelling  # the corpus tier runs it with 200 examples

TOL = {"rtol": 1e-5, "atol": 1e-6}
REFUSED, WRONG = "test.refused_reshape", "test.forgets_neg"
BLOCKS = {  # the nodes of one block from h to its output o
    "good": "s{i} = Sigmoid (h{i})\n    h{o} = Mul (h{i}, s{i})",
    "refused": "r{i} = Relu (h{i})\n    n{i} = Neg (r{i})\n    h{o} = Add (n{i}, h{i})",
    "wrong": "a{i} = Abs (h{i})\n    n{i} = Neg (a{i})\n    h{o} = Add (n{i}, h{i})",
}


def _pattern(name: str, first: str, rewriter: str) -> dict:
    return {
        "name": name,
        "description": f"{first} then Neg, rewritten by a test rewriter with a bug",
        "priority": 90,
        "targets": ["generic", "onnxruntime"],
        "nodes": [
            {"id": "first", "op": first, "inputs": {"0": "$x"}},
            {"id": "neg", "op": "Neg", "inputs": {"0": "first"}},
        ],
        "rewriter": {"name": rewriter},
    }


class _Refused(Rewriter):
    """Neg(Relu(x)) with x reshaped to rows of 7 and back: right values, where it runs."""

    name = "refused_reshape"

    def rewrite(self, match: Match, params: Params, ctx: RewriteContext) -> Rewrite:
        x = match.nodes["first"].inputs[0]
        rows = ctx.initializer("rows_of_7", np.array([-1, 7], dtype=np.int64))
        shape = ir.Node("", "Shape", [x])
        split = ir.Node("", "Reshape", [x, rows])
        relu = ir.Node("", "Relu", split.outputs)  # no Relu then Neg to match again
        back = ir.Node("", "Reshape", [relu.outputs[0], shape.outputs[0]])
        neg = ir.Node("", "Neg", back.outputs)
        nodes = [shape, split, relu, back, neg]
        return Rewrite(nodes, [(match.nodes["neg"].outputs[0], neg.outputs[0])])


class _ForgetsNeg(Rewriter):
    name = "forgets_neg"

    def rewrite(self, match: Match, params: Params, ctx: RewriteContext) -> Rewrite:
        first = ir.Node("", "Abs", [match.nodes["first"].inputs[0]])
        return Rewrite([first], [(match.nodes["neg"].outputs[0], first.outputs[0])])


def _chain(kinds: list[str]):
    body = "\n    ".join(BLOCKS[k].format(i=i, o=i + 1) for i, k in enumerate(kinds))
    text = f"""
    <ir_version: 8, opset_import: ["" : 17]>
    g (float[n, 8] h0) => (float[n, 8] h{len(kinds)}) {{
        {body}
    }}
    """
    return build_model(text)


def _optimize(model, *, stages=None, strict=False):
    registry = builtin_rewriters()
    registry.register(_Refused())
    registry.register(_ForgetsNeg())
    extra = [_pattern(REFUSED, "Relu", "refused_reshape"), _pattern(WRONG, "Abs", "forgets_neg")]
    options = OptimizeConfig(
        target="onnxruntime",
        target_profile="cpu-roofline",
        extra_patterns=extra,
        stages=stages,
        strict=strict,
    )
    return optimize(model, options, registry=registry)


KINDS = st.lists(st.sampled_from(sorted(BLOCKS)), min_size=2, max_size=6).filter(
    lambda kinds: "good" in kinds and set(kinds) != {"good"}
)
STAGES = st.sampled_from(  # the broken fusions in one stage, or across stages
    [None, [[REFUSED, "silu"], ["*"]], [[WRONG], ["*"]], [["silu"], [REFUSED], ["*"]]]
)


# each example is a fallback of several runs (a second or more): a third of the budget
@settings(
    max_examples=max(3, EXAMPLES // 3), deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
@given(kinds=KINDS, stages=STAGES)
def test_each_broken_fusion_costs_only_itself(kinds, stages) -> None:
    model = _chain(kinds)
    result = _optimize(model, stages=stages)

    assert result.check is not None and result.check.passed, (kinds, result.check.to_dict())
    goods = kinds.count("good")
    assert result.counts == {"silu": goods}, (kinds, stages, result.fallback)
    fallback = result.fallback
    assert fallback["kept"] == goods and not fallback["unchanged"]
    assert not fallback["budget"]["exhausted"]
    dropped = sorted(d["pattern"] for d in fallback["dropped"])  # one rollback each
    assert dropped == sorted([REFUSED] * kinds.count("refused") + [WRONG] * kinds.count("wrong"))
    run_both(model, result.to_proto(), **TOL)


def test_a_fusion_onnxruntime_refuses_to_run_costs_one_run() -> None:
    model = _chain(["good", "refused", "good", "good", "good", "refused", "good", "good"])
    failed = _optimize(model, strict=True)
    assert failed.check.failure == FUSED_CANNOT_RUN and "running Reshape node" in failed.check.error
    result = _optimize(model)

    assert result.check.passed and result.counts == {"silu": 6}
    # stage 1 (nothing of it here) and stage 2's run, then one more per refused fusion
    # (named by onnxruntime), none bisecting
    assert result.fallback["budget"]["runs"] == 1 + 1 + 2
    assert [d["pattern"] for d in result.fallback["dropped"]] == [REFUSED, REFUSED]
    run_both(model, result.to_proto(), **TOL)


def _crashing_stage(culprit: str, fusions: str = "abcd"):
    """A stage's run failing while ``culprit`` is applied, whose pass fails as a whole
    (its input back unfused, which passes) once ``culprit`` is rolled back, as BLT's did
    when a canonical rule's undo raised for an attention left unfused."""

    def run(skip) -> SimpleNamespace:
        if skip.get((culprit, frozenset({culprit})), "bisecting") != "bisecting":
            bug = SimpleNamespace(step="canonical", name="undo_unused", failed="it raised")
            return SimpleNamespace(applied=[], check=SimpleNamespace(passed=True), rejected=[bug])
        applied = [SimpleNamespace(pattern=f, replaced_nodes=(f,), new_nodes=()) for f in fusions
                   if (f, frozenset({f})) not in skip]  # fmt: skip
        passed = all(a.pattern != culprit for a in applied)
        check = SimpleNamespace(passed=passed, error=None if passed else f"{culprit} drifts")
        return SimpleNamespace(applied=applied, check=check)

    return run


def test_a_pass_that_fails_as_a_whole_verifies_nothing() -> None:
    result, rollbacks = culprits.roll_back_culprits(_crashing_stage("a"), 2, {})

    assert result is None  # never "passed with nothing fused": no run verified a fusion
    stopped = rollbacks[-1]
    assert stopped.pattern == "*" and "kept the stage's input" in stopped.error
    assert "applied none (canonical 'undo_unused': it raised)" in stopped.error


@pytest.mark.parametrize("culprit", ["b", "c", "d"])
def test_the_largest_run_verified_before_the_pass_failed_is_kept(culprit) -> None:
    result, rollbacks = culprits.roll_back_culprits(_crashing_stage(culprit), 2, {})

    # a run with the culprit skipped fails as a whole, so the run that verified the
    # fusions before it (bisecting) is what the stage keeps
    kept = "abcd"[: "abcd".index(culprit)]
    assert result is not None and "".join(a.pattern for a in result.applied) == kept
    assert rollbacks[-1].pattern == "*" and f"({len(kept)} fusions)" in rollbacks[-1].error
