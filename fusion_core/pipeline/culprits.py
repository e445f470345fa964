"""A failing stage's culprits, each rolled back alone (progressive validation's search).

A stage's run is a fusion pass and its check (``progressive.py``). When the check fails,
the culprit is found two ways:

- **named**: onnxruntime refused to run a node a fusion made ("... running
  GroupQueryAttention node. Name:'attention_GroupQueryAttention' ..."): that fusion is
  the culprit, found without a search (one run per refused fusion, where bisection
  takes about log2(fusions));
- **bisected**: with the fusions in the order they were applied, the smallest prefix
  that still fails ends in a culprit (wrong values, or a refusal that names no fusion's
  node).

The culprit is skipped (``optimize(..., skip=...)``) and the stage runs again until it
passes; everything else it fused is kept. A run counts as verifying only fusions it
applied: a pass that fails as a whole hands back its input unfused
(``once.optimize_once``: a bug of ours, in ``Result.rejected``), and that input passes
the check while verifying nothing. Where the search can no longer trust a run (such a
pass, or the budget spent), the stage keeps the largest set a run verified and one
rollback ``"*"`` says why.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

from autofusion.fusion_core.pipeline.result import Result

__all__ = ["MAX_ROLLBACKS_PER_STAGE", "Key", "OutOfBudget", "Rollback", "roll_back_culprits"]

MAX_ROLLBACKS_PER_STAGE = 16  # past this, the stage as a whole is not kept

Key = tuple[str, frozenset[str]]
Run = Callable[[dict[Key, str]], Result]

# onnxruntime's words for the node a session failed to run (sequential_executor.cc)
_REFUSED_NODE = re.compile(r"running \S+ node\. Name:'([^']+)'")


@dataclass(frozen=True)
class Rollback:
    stage: int
    pattern: str
    nodes: list[str]
    error: str  # what the check said with this fusion applied

    def to_dict(self) -> dict:
        return asdict(self)


class OutOfBudget(Exception):
    """The budget allows no further run: the stage keeps what it verified."""


class _Untrusted(Exception):
    """A run that was to apply fusions came back unfused: its pass failed as a whole."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


def roll_back_culprits(
    run: Run, number: int, skip: dict[Key, str]
) -> tuple[Result | None, list[Rollback]]:
    """Stage ``number`` with its culprits rolled back (``skip`` grows by them). Where the
    search stops early, the largest set a run verified (None: none, the stage's input
    is kept) and a rollback ``"*"`` saying why."""
    verified: list[Result] = []  # the largest passing run so far, alone: each holds a model
    rollbacks: list[Rollback] = []
    try:
        return _search(run, number, skip, rollbacks, verified)
    except (OutOfBudget, _Untrusted) as stop:
        best = verified[0] if verified else None
        kept = f"kept the largest verified set ({len(best.applied)} fusions)" if best else (
            "kept the stage's input")  # fmt: skip
        why = stop.why if isinstance(stop, _Untrusted) else (
            "the fallback's time budget ran out before this stage finished")  # fmt: skip
        return best, rollbacks + [Rollback(number, "*", [], f"{why}: {kept}")]


def _search(
    run: Run, number: int, skip: dict[Key, str], rollbacks: list[Rollback], verified: list[Result]
) -> tuple[Result | None, list[Rollback]]:
    def checked(skip: dict[Key, str], expected: int) -> Result:
        """``run``, trusted only when it applied something of the ``expected`` fusions."""
        result = run(skip)
        if expected and not result.applied:
            raise _Untrusted(_unfused(result, expected))
        if _passed(result) and (not verified or len(result.applied) > len(verified[0].applied)):
            verified[:] = [result]
        return result

    result = checked(skip, 0)
    while not _passed(result):
        keys = [k for k in (_key(a.pattern, a.replaced_nodes) for a in result.applied)
                if k not in skip]  # fmt: skip
        if not keys or len(rollbacks) >= MAX_ROLLBACKS_PER_STAGE:
            return None, rollbacks + [
                Rollback(number, "*", [], f"the stage was not kept: {_error(result)}")
            ]
        culprit, failing = _named(result, keys) or _bisected(checked, skip, keys, result)
        error = _error(failing)
        skip[culprit] = f"rolled back by progressive validation: {error}"
        rollbacks.append(Rollback(number, culprit[0], sorted(culprit[1]), error))
        result = checked(skip, len(keys) - 1)
    return result, rollbacks


def _named(result: Result, keys: Sequence[Key]) -> tuple[Key, Result] | None:
    """The fusion that made the node onnxruntime refused to run, when one of ``keys`` did."""
    error = result.check.error if result.check is not None else None
    found = _REFUSED_NODE.search(error or "")
    if found is None:
        return None
    makers = [_key(a.pattern, a.replaced_nodes) for a in result.applied
              if found.group(1) in a.new_nodes]  # fmt: skip
    return (makers[0], result) if len(makers) == 1 and makers[0] in keys else None


def _bisected(checked, skip: dict[Key, str], keys: list[Key], failed: Result) -> tuple[Key, Result]:
    """The last fusion of the smallest failing prefix of ``keys`` (all of them fail)."""
    low, high, failing = 1, len(keys), failed
    while low < high:
        middle = (low + high) // 2
        trial = checked(skip | {k: "bisecting" for k in keys[middle:]}, middle)
        if _passed(trial):
            low = middle + 1
        else:
            high, failing = middle, trial
    return keys[low - 1], failing


def _unfused(result: Result, expected: int) -> str:
    """Why a run that was to apply ``expected`` fusions applied none."""
    bugs = "; ".join(f"{r.step} {r.name!r}: {r.failed}" for r in result.rejected)
    return (
        f"the fusion pass, to apply {expected} fusions with the others skipped, applied none "
        f"({bugs or 'no step said why'}), so no run could tell the culprit"
    )


def _key(pattern: str, nodes: Sequence[str]) -> Key:
    return pattern, frozenset(nodes)


def _passed(result: Result) -> bool:
    return result.check is not None and result.check.passed


def _error(result: Result) -> str:
    """What the check of ``result`` said failed."""
    check = result.check
    if check is None:
        return "not checked"
    if check.error:
        return check.error
    failed = [o for o in check.outputs if not o.passed]
    return "; ".join(f"output {o.name!r}: {o.detail}" for o in failed) or "check failed"
