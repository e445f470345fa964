"""Progressive validation: fuse in stages, check after each, roll back only what breaks.

An optimizer that changes a model's answers is worst when the user has to bisect the
culprit by hand. Here each stage (a group of patterns, by name glob) runs the whole
pipeline on the previous stage's output and checks it against that input. When the
check fails, the stage's fusions are bisected: with the fusions in the order they were
applied, the smallest prefix that still fails ends in a culprit; that fusion is rolled
back (re-running the stage with it skipped: ``optimize(..., skip=...)``), and the search
repeats until the stage passes. Everything else the stage fused is kept. Each culprit
costs about log2(fusions) extra runs of the stage.

The default stages put the memory-bound fusions first (folds into weights, normalizations,
activations: cheap to verify, rarely wrong) and the compute-bound ones (fused convolutions
and GEMMs, merged projections, attention) after; any list of globs can replace them.
The verdict compares the final model with the original as the caller gave it (not the
copy after the pre-passes the stages start from). This is also what a failed check
falls back to (``fallback.py``).
"""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.catalog import CompiledPattern
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.pipeline.check import check_against_original
from autofusion.fusion_core.pipeline.once import optimize_once, original_of, select_patterns
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.pipeline.switches import resolve_switches
from autofusion.fusion_core.rewriters import RewriterRegistry, builtin_rewriters
from autofusion.fusion_core.validate import ModelFile

__all__ = [
    "DEFAULT_STAGES",
    "Budget",
    "Rollback",
    "optimize_progressive",
    "progressive_as_configured",
]

DEFAULT_STAGES: tuple[tuple[str, ...], ...] = (
    (
        "*_bn",
        "conv_add",
        "conv_mul",
        "pad_conv",
        "layer_norm*",
        "rms_norm*",
        "gelu_*",
        "attention_scale_fold*",
    ),
    ("*",),
)
MAX_ROLLBACKS_PER_STAGE = 16  # past this, the stage as a whole is not kept

_Key = tuple[str, frozenset[str]]


@dataclass(frozen=True)
class Rollback:
    stage: int
    pattern: str
    nodes: list[str]
    error: str  # what the check said with this fusion applied

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Budget:
    """A bound on the stage runs (each a fusion pass and its check) progressive validation
    may start: past ``seconds`` it starts none, and each stage keeps the largest set of
    fusions a run verified so far (or its input). The fallback sets one; progressive
    mode, which the caller asked for, runs unbounded."""

    seconds: float
    started: float = field(default_factory=time.monotonic)
    runs: int = 0
    exhausted: bool = False

    def allows(self) -> bool:
        """Whether another run may start (counted when it may)."""
        if time.monotonic() - self.started >= self.seconds:
            self.exhausted = True
        self.runs += not self.exhausted
        return not self.exhausted

    def to_dict(self) -> dict:
        spent = round(time.monotonic() - self.started, 3)
        return {"seconds": self.seconds, "spent": spent, "runs": self.runs,
                "exhausted": self.exhausted}  # fmt: skip


def optimize_progressive(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
    config: OptimizeConfig | None = None,
    *,
    stages: Sequence[Sequence[str]] = DEFAULT_STAGES,
    registry: RewriterRegistry | None = None,
    patterns: Sequence[CompiledPattern] | None = None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    budget: Budget | None = None,
) -> Result:
    """``optimize`` in checked stages; ``Result.rollbacks`` lists what was taken back.
    With a ``budget``, runs stop when it is spent (``Budget``)."""
    config = config or OptimizeConfig()
    registry = registry or builtin_rewriters()
    check = config.check.model_copy(update={"enabled": True})
    no_fusion = {"patterns": [], "switches": [], "check": check}
    first = optimize_once(model, config.model_copy(update=no_fusion), registry=registry)
    config, switched = resolve_switches(config, first.model)  # every stage sees the same
    chosen = select_patterns(config, registry, patterns)  # once: every stage takes from it
    available = [p.name for p in chosen]
    keep_fp32 = {p.name for p in chosen if p.spec.keep_fp32}
    current: ir.Model = first.model  # after loading and the pre-passes, before any fusion
    done: list[Result] = []
    rollbacks: list[Rollback] = []
    skip: dict[_Key, str] = {}  # rolled back in an earlier stage stays rolled back
    for number, globs in enumerate(stages, start=1):
        names = [n for n in available if any(fnmatch.fnmatch(n, g) for g in globs)]
        if not names:
            continue
        update = {"patterns": names, "exclude": [], "check": check}
        stage_config = config.model_copy(update=update | _fold_left(first, done))

        def run(
            skip: dict[_Key, str], *, source: ir.Model = current, cfg: OptimizeConfig = stage_config
        ) -> Result:
            return optimize_once(
                source, cfg, registry=registry, patterns=patterns, skip=skip, feeds=feeds
            )

        result, stage_rollbacks = _bisect_stage(_bounded(run, budget), number, skip)
        rollbacks += stage_rollbacks
        if result is None:  # even with nothing fused the stage fails: keep its input
            continue
        done.append(result)
        current = result.model
    original = original_of(model) if config.check.enabled else None
    final = _combined(first, done, rollbacks, original, config, keep_fp32, feeds)
    final.switches = [s.to_dict() for s in switched]
    return final


def progressive_as_configured(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
    config: OptimizeConfig,
    *,
    registry: RewriterRegistry | None = None,
    patterns: Sequence[CompiledPattern] | None = None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    budget: Budget | None = None,
) -> Result:
    """Progressive validation in the config's stages (the default ones when it names
    none), each stage a plain pass: progressive mode, and the fallback after a failed
    check (with a ``budget``)."""
    stepwise = config.model_copy(update={"progressive": False, "stages": None})
    return optimize_progressive(
        model,
        stepwise,
        stages=config.stages or DEFAULT_STAGES,
        registry=registry,
        patterns=patterns,
        feeds=feeds,
        budget=budget,
    )


class _OutOfBudget(Exception):
    """The budget allows no further run: the stage keeps what it verified."""


def _bounded(run, budget: Budget | None):
    """``run``, refused with _OutOfBudget once ``budget`` is spent."""
    if budget is None:
        return run

    def bounded(skip: dict[_Key, str]) -> Result:
        if not budget.allows():
            raise _OutOfBudget
        return run(skip)

    return bounded


def _bisect_stage(run, number: int, skip: dict[_Key, str]) -> tuple[Result | None, list[Rollback]]:
    """The stage with its culprits rolled back; when the budget runs out, the largest set
    a run verified (None: none, the stage's input is kept) and a rollback saying so."""
    verified: list[Result] = []  # the largest passing run so far, alone: each holds a model
    rollbacks: list[Rollback] = []
    try:
        return _bisect(run, number, skip, rollbacks, verified)
    except _OutOfBudget:
        best = verified[0] if verified else None
        kept = f"kept the largest verified set ({len(best.applied)} fusions)" if best else (
            "kept the stage's input")  # fmt: skip
        why = f"the fallback's time budget ran out before this stage finished: {kept}"
        return best, rollbacks + [Rollback(number, "*", [], why)]


def _bisect(
    run, number: int, skip: dict[_Key, str], rollbacks: list[Rollback], verified: list[Result]
) -> tuple[Result | None, list[Rollback]]:
    def checked(skip: dict[_Key, str]) -> Result:
        result = run(skip)
        if _passed(result) and (not verified or len(result.applied) > len(verified[0].applied)):
            verified[:] = [result]
        return result

    result = checked(skip)
    while not _passed(result):
        keys = [_key(a.pattern, a.replaced_nodes) for a in result.applied]
        keys = [k for k in keys if k not in skip]
        if not keys or len(rollbacks) >= MAX_ROLLBACKS_PER_STAGE:
            return None, rollbacks + [
                Rollback(number, "*", [], f"the stage was not kept: {_error(result)}")
            ]
        # applying keys[:k] fails for k = len(keys); find the smallest failing k
        low, high, failing = 1, len(keys), result
        while low < high:
            middle = (low + high) // 2
            trial = checked(skip | {k: "bisecting" for k in keys[middle:]})
            if _passed(trial):
                low = middle + 1
            else:
                high, failing = middle, trial
        culprit = keys[low - 1]
        error = _error(failing)
        skip[culprit] = f"rolled back by progressive validation: {error}"
        rollbacks.append(Rollback(number, culprit[0], sorted(culprit[1]), error))
        result = checked(skip)
    return result, rollbacks


def _combined(
    first: Result,
    stages: list[Result],
    rollbacks: list[Rollback],
    original: onnx.ModelProto | ModelFile | None,
    config: OptimizeConfig,
    keep_fp32: set[str],
    feeds: Sequence[Mapping[str, np.ndarray]] | None,
) -> Result:
    final = stages[-1] if stages else first
    final.applied = [a for stage in stages for a in stage.applied]
    final.near_misses = [m for stage in stages for m in stage.near_misses]
    final.ops_before = first.ops_before
    final.subgraph_ops_before = first.subgraph_ops_before
    final.prepasses = first.prepasses
    final.folding, final.input_bytes = first.folding, first.input_bytes
    final.rounds = sum(stage.rounds for stage in stages)
    final.rollbacks = [r.to_dict() for r in rollbacks]
    final.rejected = list(dict.fromkeys(r for s in [first, *stages] for r in s.rejected))
    final.regions = None
    final.check = None
    if original is not None:
        check_against_original(final, original, config, keep_fp32, feeds)
    return final


def _fold_left(first: Result, done: Sequence[Result]) -> dict[str, object]:
    """Config fields giving a stage's constant folding what the fold budget has left.
    Each stage starts from the previous one's model: a budget of its own, relative to
    that model, would let every stage add as much again."""
    if first.folding is None:
        return {}
    grown = first.folding.grown_bytes + sum(r.folding.grown_bytes for r in done if r.folding)
    return {
        "fold_growth_ratio": 0.0,
        "fold_growth_floor_bytes": max(first.folding.budget_bytes - grown, 0),
    }


def _key(pattern: str, nodes: Sequence[str]) -> _Key:
    return pattern, frozenset(nodes)


def _passed(result: Result) -> bool:
    return result.check is not None and result.check.passed


def _error(result: Result) -> str:
    check = result.check
    if check is None:
        return "not checked"
    if check.error:
        return check.error
    failed = [o for o in check.outputs if not o.passed]
    return "; ".join(f"output {o.name!r}: {o.detail}" for o in failed) or "check failed"
