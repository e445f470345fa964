"""The fallback's bisection is bounded (fusion_core/pipeline/fallback.py, progressive.py).

Each re-run is a fusion pass and its check, minutes on a big model: past its budget the
fallback starts no run, each stage keeps the largest set of fusions a run verified (or
its input), and ``Result.fallback["budget"]`` says so. The model is test_fallback's: a
SiLU the built-ins fuse and a wrong fusion (Relu then Neg rewritten as Relu alone).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import onnx_ir as ir
import pytest

from autofusion.fusion_core.pipeline import culprits, fallback, progressive
from autofusion.fusion_core.pipeline.progressive import Budget
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.testing import build_model, run_both
from tests.fusion_core.test_fallback import _optimize
from tests.fusion_core.test_transactions import MODEL, TOL


@dataclass
class _Runs(Budget):
    """A budget of ``left`` runs, not seconds: the test decides where it runs out."""

    left: int = 0

    def allows(self) -> bool:
        self.exhausted = self.exhausted or self.left <= 0
        self.left -= 1
        self.runs += not self.exhausted
        return not self.exhausted


def _with_budget(monkeypatch, budget: Budget):
    monkeypatch.setattr(fallback, "Budget", lambda seconds: budget)
    model = build_model(MODEL)
    return model, _optimize(model)


def test_a_spent_budget_stops_the_fallback_and_says_so(monkeypatch) -> None:
    model, result = _with_budget(monkeypatch, _Runs(seconds=0.0, left=0))

    assert result.check.passed and result.counts == {}
    budget = result.fallback["budget"]
    assert budget["exhausted"] and budget["runs"] == 0
    stopped = result.fallback["dropped"]  # one per stage of the default two
    assert [s["stage"] for s in stopped] == [1, 2] and {s["pattern"] for s in stopped} == {"*"}
    assert all("time budget ran out" in s["error"] for s in stopped)
    assert all("kept the stage's input" in s["error"] for s in stopped)
    run_both(model, result.to_proto(), **TOL)


def _stage(culprit: str, fusions: str = "abcd"):
    """A stage's run: the fusions not skipped applied, failing while ``culprit`` is."""

    def run(skip) -> SimpleNamespace:
        applied = [SimpleNamespace(pattern=f, replaced_nodes=(f,)) for f in fusions
                   if (f, frozenset({f})) not in skip]  # fmt: skip
        passed = all(a.pattern != culprit for a in applied)
        check = SimpleNamespace(passed=passed, error=None if passed else f"{culprit} drifts")
        return SimpleNamespace(applied=applied, check=check)

    return run


@pytest.mark.parametrize(
    ("runs", "kept", "note"),
    [
        (1, None, "kept the stage's input"),  # abcd fails: nothing verified
        (2, "ab", "kept the largest verified set (2 fusions)"),  # ab passes, abc not run
        (3, "ab", "kept the largest verified set (2 fusions)"),  # abc fails: c is the culprit
        (4, "abd", None),  # abd passes: the stage as without a budget
    ],
)
def test_a_budget_spent_mid_bisection_keeps_the_largest_verified_set(runs, kept, note) -> None:
    budget = _Runs(seconds=0.0, left=runs)
    result, rollbacks = culprits.roll_back_culprits(
        progressive._bounded(_stage("c"), budget), 2, {}
    )

    assert (result and "".join(a.pattern for a in result.applied)) == kept
    assert budget.exhausted == (note is not None)
    if note:
        assert rollbacks[-1].pattern == "*" and note in rollbacks[-1].error
    assert [r.pattern for r in rollbacks if r.pattern != "*"] == (["c"] if runs >= 3 else [])


def test_a_budget_large_enough_bisects_as_before(monkeypatch) -> None:
    model, result = _with_budget(monkeypatch, _Runs(seconds=0.0, left=100))

    assert result.counts == {"silu": 1} and not result.fallback["budget"]["exhausted"]
    assert [d["pattern"] for d in result.fallback["dropped"]] == ["test.forgets_neg"]


def test_the_real_budget_runs_out_on_time() -> None:
    budget = Budget(0.0)
    assert not budget.allows() and budget.exhausted and budget.runs == 0
    assert Budget(60.0).allows()


@pytest.mark.parametrize(("seconds", "expected"), [(0.1, 10.0), (4.0, 32.0)])
def test_the_budget_is_a_multiple_of_the_failed_run(seconds, expected) -> None:
    model = ir.Model(ir.Graph([], [], nodes=[]), ir_version=8)
    timings = {"fuse": seconds / 2, "check": seconds / 2}
    failed = Result(model=model, target="generic", patterns_used=[], timings=timings)
    assert fallback.fallback_budget(failed) == pytest.approx(expected)
    assert fallback.FALLBACK_RUNS == 8 and fallback.FALLBACK_MIN_SECONDS == 10.0
