"""Progressive validation: fuse in stages, check after each, roll back only what breaks.

An optimizer that changes a model's answers is worst when the user has to bisect the
culprit by hand. Here each stage (a group of patterns, by name glob) runs the whole
pipeline on the previous stage's output and checks it against that input. When the
check fails, each culprit is found (``culprits.py``: the fusion that made the node
onnxruntime refused to run, else by bisection of the fusions in the order they were
applied) and rolled back alone (re-running the stage with it skipped:
``optimize(..., skip=...)``) until the stage passes. Everything else the stage fused is
kept. A refused node costs one extra run of the stage, a bisected culprit about
log2(fusions).

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
from dataclasses import dataclass, field

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.catalog import CompiledPattern
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.pipeline.check import check_against_original
from autofusion.fusion_core.pipeline.culprits import Key, OutOfBudget, Rollback, roll_back_culprits
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
    current: ir.Model = _named_nodes(first.model)  # after the pre-passes, before any fusion
    done: list[Result] = []
    rollbacks: list[Rollback] = []
    skip: dict[Key, str] = {}  # rolled back in an earlier stage stays rolled back
    for number, globs in enumerate(stages, start=1):
        names = [n for n in available if any(fnmatch.fnmatch(n, g) for g in globs)]
        if not names:
            continue
        update = {"patterns": names, "exclude": [], "check": check}
        stage_config = config.model_copy(update=update | _fold_left(first, done))

        def run(
            skip: dict[Key, str], *, source: ir.Model = current, cfg: OptimizeConfig = stage_config
        ) -> Result:
            return optimize_once(
                source, cfg, registry=registry, patterns=patterns, skip=skip, feeds=feeds
            )

        result, stage_rollbacks = roll_back_culprits(_bounded(run, budget), number, skip)
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


def _bounded(run, budget: Budget | None):
    """``run``, refused with OutOfBudget once ``budget`` is spent."""
    if budget is None:
        return run

    def bounded(skip: dict[Key, str]) -> Result:
        if not budget.allows():
            raise OutOfBudget
        return run(skip)

    return bounded


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


def _named_nodes(model: ir.Model) -> ir.Model:
    """``model`` with a name on every node: a rollback skips a fusion by its nodes' names,
    and two fusions of unnamed nodes (``<Neg>``, ``<Relu>``) would be one to skip."""
    nodes = list(ir.traversal.RecursiveGraphIterator(model.graph))
    taken = {n.name for n in nodes if n.name}
    for number, node in enumerate(nodes):
        if node.name:
            continue
        name, k = f"{node.op_type}_{number}", 1
        while name in taken:
            name, k = f"{node.op_type}_{number}_{k}", k + 1
        node.name = name
        taken.add(name)
    return model


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
