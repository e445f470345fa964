"""Measured selection: the cost model proposes, the target machine decides.

A cost model prices a fusion from bandwidth, FLOPs and launches; the kernel onnxruntime
actually runs for it may be slower than the ops it replaces at this thread count, or
onnxruntime may form the same fusion itself at ``ORT_ENABLE_ALL``, so that ours gains
nothing. Here the proposal (``optimize`` with the config's own selection) is grouped:
the fusions of one pattern that emit the same ops form one group, so a BERT's 12
attention blocks are one measurement, not 12. Then, on this machine:

1. the proposal ("full") runs side by side with "full without group g" for every group,
   interleaved and paired (``fusion_core.profiling.stats``), at the deployment level and
   thread count; a group is kept only when full is faster than full-without-it beyond
   the noise: the whole 95% interval of the paired ratio below 1, and its median at
   least 1% below (``fusion_core.profiling.stats.MARGIN``);
2. the model with the kept groups is built (and checked), and measured against the
   original once more; when that is slower, no fusion is kept, and the report says so;
   when it is not measurably faster, the report says that plainly.

``MeasureOptions.budget_s`` bounds the wall time of measuring, from the first session
to the final comparison (building the variants and their sessions included; the proposal
and the check of the result are not): groups are measured in the order of their
predicted gain, a few at a time, each batch's runs planned from its slowest warm-up, and
a quarter of the budget is kept for the final comparison. A group the budget does not
reach is left out (not kept: a fusion is kept only for a measured reason). Only the
minimum number of paired runs a verdict needs (``min_runs``) can take the time past the
budget. Decisions are cached per machine class and model structure
(``fusion_core.pipeline._measure_cache``): a second job on the same architecture measures only
the final comparison.

When the original model cannot run on any input sizes tried (the check's candidate
sizes, or the user's sample), nothing is measured and no fusion is kept; when the final
comparison says slower, the original model is handed out as it came (no fusion, no
constant folding, no shape rewrites; Identity and inference Dropout are still removed).
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.catalog import CompiledPattern
from autofusion.fusion_core.config import MeasureOptions, OptimizeConfig
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.ir import load_model
from autofusion.fusion_core.patterns import NearMiss
from autofusion.fusion_core.pipeline._measure_cache import (
    DecisionCache,
    machine_class,
    model_structure,
)
from autofusion.fusion_core.pipeline.once import AppliedFusion, Result, optimize_once
from autofusion.fusion_core.profiling import (
    FASTER,
    SLOWER,
    PairedRatio,
    inputs_for,
    interleaved_ms,
    make_session,
    paired_ratio,
    prepare_model,
)
from autofusion.fusion_core.rewriters import RewriterRegistry
from autofusion.fusion_core.validate import (
    CANDIDATES,
    FloatDistribution,
    candidate_dims,
    input_dims,
    random_inputs,
)

__all__ = ["FusionGroup", "PairedTimer", "group_fusions", "optimize_measured"]

logger = logging.getLogger(__name__)

_PROVIDERS = ("CPUExecutionProvider",)
_BATCH = 3  # variants timed beside the full model at once (sessions held in memory)
_WARMUP = 2
_MAX_RUNS = 400
_PASSES = 3
_FINAL_SHARE = 0.25  # of the budget, kept for the final comparison with the original
SkipMap = dict[tuple[str, frozenset[str]], str]


@dataclass
class FusionGroup:
    """The fusions of one pattern that emit the same ops: measured together."""

    pattern: str
    new_ops: tuple[str, ...]
    fusions: list[AppliedFusion] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.pattern} -> {'+'.join(self.new_ops) or '(nothing)'}"

    @property
    def predicted_saved_us(self) -> float:
        saved = [(f.predicted_gain or {}).get("saved_us") for f in self.fusions]
        return float(sum(s for s in saved if isinstance(s, (int, float))))

    def skip(self, reason: str) -> SkipMap:
        return {(f.pattern, frozenset(f.replaced_nodes)): reason for f in self.fusions}


def group_fusions(applied: Sequence[AppliedFusion]) -> list[FusionGroup]:
    """Groups by pattern and emitted ops, the largest predicted gain first."""
    groups: dict[tuple[str, tuple[str, ...]], FusionGroup] = {}
    for fusion in applied:
        key = (fusion.pattern, tuple(sorted(set(fusion.new_ops))))
        groups.setdefault(key, FusionGroup(*key)).fusions.append(fusion)
    return sorted(groups.values(), key=lambda g: (-g.predicted_saved_us, g.key))


def optimize_measured(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
    config: OptimizeConfig,
    *,
    registry: RewriterRegistry | None = None,
    patterns: Sequence[CompiledPattern] | None = None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    timer_factory: Callable[[MeasureOptions, Path], PairedTimer] | None = None,
) -> Result:
    """``optimize`` with only the fusion groups that measure faster on this machine;
    ``Result.measurement`` says what was measured and decided (see the module doc).
    ``timer_factory`` replaces the timing (tests decide the ratios with it)."""
    if config.mode != "measured":  # and refused when progressive too
        raise ConfigError(f"measured selection needs a measured config, not {config.mode!r}")
    started = time.perf_counter()
    opts = config.measure_options
    # Every variant is built in measured mode: config.proposer proposes, keeping what
    # the cost model prices as a loss (this machine decides).
    base = config
    original = _as_proto(model)
    run = _Run(original, base, feeds, registry, patterns)
    proposal = run.build(run.unchecked, {})
    record: dict[str, Any] = {
        "proposer": config.proposer,
        "level": opts.level,
        "threads": opts.threads,
        "budget_s": opts.budget_s,
        "groups": [],
        "final": None,
        "fallback": None,
        "error": None,
    }
    with tempfile.TemporaryDirectory(prefix="autofusion-measure-") as scratch:
        run.timer = (timer_factory or PairedTimer)(opts, Path(scratch))
        if run.timer.feeds_for(original, config, feeds) is None:
            # The check of the result says what cannot run, and how to give sizes.
            record["error"] = (
                "the original model cannot run on generated inputs at any of the sizes tried: "
                "nothing measured, so no fusion is kept (give input sizes with --dim NAME=SIZE "
                "or a sample with --inputs)"
            )
            result = run.build(_unchanged(base), {}, feeds)
            return _finish(result, record, started, DecisionCache(None))
        run.cache = DecisionCache(opts.cache_dir)
        decisions = _measure_groups(run, proposal)
        result = _keep_what_measured_faster(run, decisions, record)
        record["groups"] = [d.to_dict() for d in decisions.values()]
    return _finish(result, record, started, run.cache)


@dataclass
class _Run:
    """One measured selection: the original, how to build a variant, and the timer."""

    original: onnx.ModelProto
    base: OptimizeConfig
    feeds: Sequence[Mapping[str, np.ndarray]] | None
    registry: RewriterRegistry | None
    patterns: Sequence[CompiledPattern] | None
    timer: PairedTimer | None = None
    cache: DecisionCache | None = None

    @property
    def unchecked(self) -> OptimizeConfig:
        return self.base.model_copy(
            update={"check": self.base.check.model_copy(update={"enabled": False})}
        )

    def build(self, cfg: OptimizeConfig, skip: SkipMap, user_feeds=None) -> Result:
        return optimize_once(
            self.original,
            cfg,
            registry=self.registry,
            patterns=self.patterns,
            skip=skip,
            skip_kind="selection",
            feeds=user_feeds,
        )


def _measure_groups(run: _Run, proposal: Result) -> dict[str, _Decision]:
    """A decision per group of the proposal, and of what leaving groups out exposes."""
    opts = run.timer.opts
    machine = machine_class(level=opts.level, threads=opts.threads, providers=_PROVIDERS)
    structure = model_structure(run.original, run.timer.dims)
    decisions: dict[str, _Decision] = {}
    current = proposal
    # Leaving a group out can let a smaller form of it fuse in its place (BiasGelu
    # left out, Gelu fuses): such new groups are measured in turn, on the model
    # they appear in, for a few passes at most.
    for _ in range(_PASSES):
        pending = [g for g in group_fusions(current.applied) if g.key not in decisions]
        if not pending:
            break
        context = (current.to_proto(), run.build, run.unchecked, run.timer, run.cache)
        decisions.update(_decide(pending, *context, machine, structure))
        current = _build_without(run.build, run.unchecked, None, decisions)
    # What the last pass exposed is left out unmeasured; leaving it out can expose more
    # (a merge left out lets the unmerged form of a kept fusion match), so until the
    # model built from these decisions applies no group without one.
    reason = "measured selection: appeared when other groups were left out, unmeasured"
    for _ in range(_PASSES):
        exposed = [g for g in group_fusions(current.applied) if g.key not in decisions]
        if not exposed:
            break
        decisions.update({g.key: _Decision(g, False, reason) for g in exposed})
        current = _build_without(run.build, run.unchecked, None, decisions)
    return decisions


def _keep_what_measured_faster(run: _Run, decisions: dict[str, _Decision], record: dict) -> Result:
    """The model with the kept groups, measured against the original once more: when
    it is slower, the original as it came (and every decision says it was overruled)."""
    timer = run.timer
    started_build = time.perf_counter()
    result = _build_without(run.build, run.base, run.feeds, decisions)  # and its check
    timer.charge(-(time.perf_counter() - started_build))  # not timed against the budget
    final = timer.compare(result.to_proto(), run.original, budget_s=timer.remaining())
    record["final"] = final.to_dict() if final else None
    if final is None or final.verdict != SLOWER:
        return result
    record["fallback"] = (
        f"the model with the kept fusions measured slower than the original "
        f"({final.describe()}): no fusion is kept, and the original model is handed "
        "out as it came"
    )
    overruled = "measured selection: the fused model as a whole measured slower"
    for decision in decisions.values():
        if decision.kept:
            decision.kept, decision.reason = False, f"{overruled} ({decision.reason})"
    result = run.build(_unchanged(run.base), {}, run.feeds)
    result.near_misses += [
        NearMiss(f.pattern, f.replaced_nodes, d.reason, "selection")
        for d in decisions.values()
        for f in d.group.fusions
    ]
    return result


@dataclass
class _Decision:
    group: FusionGroup
    kept: bool
    reason: str
    ratio: PairedRatio | None = None
    cached: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group.key,
            "pattern": self.group.pattern,
            "new_ops": list(self.group.new_ops),
            "fusions": len(self.group.fusions),
            "predicted_saved_us": self.group.predicted_saved_us,
            "kept": self.kept,
            "cached": self.cached,
            "ratio": self.ratio.to_dict() if self.ratio else None,
            "reason": self.reason,
        }


def _decide(pending, full, build, unchecked, timer, cache, machine, structure):
    """A decision per group: from the cache, or measured ``full`` against full without it."""
    decisions: dict[str, _Decision] = {}
    to_measure = []
    for group in pending:
        entry = cache.get(cache.key(machine, structure, group.key))
        if entry is None:
            to_measure.append(group)
            continue
        ratio = PairedRatio(**entry["ratio"]) if isinstance(entry.get("ratio"), dict) else None
        decisions[group.key] = _Decision(group, entry["kept"], entry["reason"], ratio, cached=True)
    phase_budget = timer.budget * (1 - _FINAL_SHARE)
    for start in range(0, len(to_measure), _BATCH):
        batch = to_measure[start : start + _BATCH]
        left = phase_budget - timer.spent
        ratios = None
        if left > timer.least_cost(len(batch) + 1):
            share = left * len(batch) / (len(to_measure) - start)
            skip_each = {g.key: g.skip("measured selection") for g in batch}
            variants = {key: build(unchecked, skip).to_proto() for key, skip in skip_each.items()}
            ratios = timer.with_and_without(full, variants, budget_s=share)
        for group in batch:
            ratio = (ratios or {}).get(group.key)
            decisions[group.key] = decision = _judge(group, ratio, timer)
            if ratio is not None:
                cache.put(
                    cache.key(machine, structure, group.key),
                    {"kept": decision.kept, "reason": decision.reason, "ratio": ratio.to_dict()},
                )
    return decisions


def _judge(group: FusionGroup, ratio: PairedRatio | None, timer: PairedTimer) -> _Decision:
    where = f"{timer.opts.level}, {timer.opts.threads} thread(s)"
    if ratio is None:
        reason = "measured selection: not measured within the time budget (--measure-budget)"
        return _Decision(group, False, reason)
    if ratio.verdict == FASTER:
        reason = f"measured faster: with/without {ratio.describe()}, {where}"
        return _Decision(group, True, reason, ratio)
    reason = (
        f"measured selection: {ratio.verdict} on this machine, with/without these fusions "
        f"{ratio.describe()}, {where}"
    )
    return _Decision(group, False, reason, ratio)


def _build_without(build, cfg, feeds, decisions: Mapping[str, _Decision]) -> Result:
    """The model without the groups decided against, each left-out fusion a near miss
    with its reason. A pattern none of whose groups is kept is excluded outright: a
    skipped fusion can rename what a later round matches, so skipping by node names
    could let it back in elsewhere. A dropped group of a pattern that also has a kept
    group is skipped by its nodes, and the model built again if it reappears."""
    kept_patterns = {d.group.pattern for d in decisions.values() if d.kept}
    dropped = [d for d in decisions.values() if not d.kept]
    excluded = {d.group.pattern for d in dropped} - kept_patterns
    cfg = cfg.model_copy(update={"exclude": sorted(set(cfg.exclude) | excluded)})
    reasons = {d.group.key: d.reason for d in dropped if d.group.pattern in kept_patterns}
    skip: SkipMap = {}
    for decision in dropped:
        if decision.group.key in reasons:
            skip.update(decision.group.skip(decision.reason))
    for _ in range(_PASSES):
        result = build(cfg, skip, feeds)
        again = {}
        for group in group_fusions(result.applied):
            if group.key in reasons:
                again.update(group.skip(reasons[group.key]))
        if not again:
            break
        skip.update(again)
    result.near_misses += [
        NearMiss(f.pattern, f.replaced_nodes, d.reason, "selection")
        for d in dropped
        if d.group.pattern in excluded
        for f in d.group.fusions
    ]
    return result


def _unchanged(config: OptimizeConfig) -> OptimizeConfig:
    """The original as it came: no pattern at all (leaving every group out would let
    others fuse instead), no constant folding, no shape rewrites, no opset upgrade."""
    update = {
        "patterns": [],
        "fold_constants": False,
        "shape_inference": False,
        "upgrade_opset": None,
    }
    return config.model_copy(update=update)


def _finish(result: Result, record: dict, started: float, cache: DecisionCache) -> Result:
    record["cache"] = {"hits": cache.hits, "misses": cache.misses}
    record["seconds"] = round(time.perf_counter() - started, 3)
    result.measurement = record
    result.timings["measure"] = record["seconds"]
    return result


def _as_proto(model: ir.Model | onnx.ModelProto | str | os.PathLike) -> onnx.ModelProto:
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (str, os.PathLike)):
        model = load_model(model)  # refuses hostile external-data paths
        ir.external_data.load_to_model(model)
    return ir.to_proto(model)


class PairedTimer:
    """Sessions at the deployment level and the paired timing loops, within a budget."""

    def __init__(self, opts: MeasureOptions, scratch: Path) -> None:
        self.opts = opts
        self.budget = opts.budget_s
        self.scratch = scratch
        self.sample: dict[str, np.ndarray] = {}
        self.dims: dict[str, int] = {}
        self._started = time.perf_counter()
        self._charged = 0.0  # seconds a fake timer says it spent (tests)
        self._run_s = 0.0  # the slowest warm-up run of one session seen so far

    @property
    def spent(self) -> float:
        """Wall seconds since the timer was made: sessions, variants built, runs."""
        return time.perf_counter() - self._started + self._charged

    def charge(self, seconds: float) -> None:
        """Count ``seconds`` more (a fake's runs) or, negative, fewer (the result's check,
        which is not part of the budget) against the budget."""
        self._charged += seconds

    def remaining(self) -> float:
        return max(self.budget - self.spent, 0.0)

    def least_cost(self, sessions: int) -> float:
        """The fewest seconds a comparison of ``sessions`` models can take: ``min_runs``
        runs of each at the slowest run seen (0 before the first comparison)."""
        return self.opts.min_runs * sessions * self._run_s

    def session(self, proto: onnx.ModelProto, label: str):
        prepared = prepare_model(proto, label, self.scratch)
        return make_session(
            prepared, self.opts.level, threads=self.opts.threads, providers=_PROVIDERS
        )

    def feeds_for(self, original, config: OptimizeConfig, feeds) -> dict | None:
        """The user's first sample, or generated inputs at the first of the check's
        candidate sizes the original runs on (the same sizes the check tries)."""
        session = self.session(original, "original")
        c = config.check
        distribution = FloatDistribution(
            c.input_distribution, mean=c.input_mean, std=c.input_std, low=c.input_low,
            high=c.input_high,
        )  # fmt: skip
        candidates: list[tuple[dict, dict]] = []
        if feeds:
            candidates.append((dict(feeds[0]), {}))
        else:
            free = input_dims(original)
            for k in range(CANDIDATES):
                dims = candidate_dims(free, c.shape_profiles()[0], k)
                sample = random_inputs(original, seed=c.seed, dims=dims, distribution=distribution)
                candidates.append((sample, dims))
        for sample, dims in candidates:
            try:
                session.run(None, inputs_for(session, sample))
            except Exception as exc:  # onnxruntime raises its own types; try the next sizes
                logger.debug("measured selection: the original does not run on %s: %s", dims, exc)
                continue
            self.sample, self.dims = sample, dims
            return sample
        return None

    def with_and_without(
        self, full: onnx.ModelProto, variants: Mapping[str, onnx.ModelProto], *, budget_s: float
    ) -> dict[str, PairedRatio]:
        """full / variant per variant, from one interleaved loop over all of them."""
        protos = {"full": full, **variants}
        times = self._timed(protos, budget_s)
        return {
            label: ratio
            for label in variants
            if (ratio := paired_ratio(times["full"], times[label])) is not None
        }

    def compare(self, fused: onnx.ModelProto, original, *, budget_s: float) -> PairedRatio | None:
        times = self._timed({"fused": fused, "original": original}, budget_s)
        return paired_ratio(times["fused"], times["original"])

    def _timed(self, protos: Mapping[str, onnx.ModelProto], budget_s: float) -> dict:
        start = time.perf_counter()
        sessions = {label: self.session(p, label) for label, p in protos.items()}
        inputs = {label: inputs_for(s, self.sample) for label, s in sessions.items()}
        warm = interleaved_ms(sessions, inputs, warmup=0, iters=_WARMUP)
        # Plan from the slowest warm-up, not the fastest: on a loaded machine a plan
        # from the fastest run overran a 60 s budget by up to 2.4x.
        slowest = {label: max(t) / 1000 for label, t in warm.items()}
        self._run_s = max(self._run_s, *slowest.values())
        iteration_s = sum(slowest.values())
        left = budget_s - (time.perf_counter() - start)
        runs = int(left / iteration_s) if iteration_s > 0 else _MAX_RUNS
        runs = max(self.opts.min_runs, min(runs, _MAX_RUNS))
        return interleaved_ms(sessions, inputs, warmup=0, iters=runs)
