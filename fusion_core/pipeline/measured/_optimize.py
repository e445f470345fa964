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
budget.

What was measured is kept as verdicts (``fusion_core.profiling.verdicts``), by region signature
(``_signature.py``) and machine class, not by model: a group whose signature has a
confident verdict in the store (``_store.py``: the service's prefetch, a user's export,
the local CLI's folder) is decided without timing, so a second job on the same model,
or on another model with the same regions, times only what is new. The final comparison
takes at most as long as the groups' timing did (at least ``_FINAL_FLOOR`` of the
budget, at most its quarter): a job decided from the store is not held up by it.

When the original model cannot run on any input sizes tried (the check's candidate
sizes, or the user's sample), nothing is measured and no fusion is kept; when the final
comparison says slower, the original model is handed out as it came (no fusion, no
constant folding, no shape rewrites; Identity and inference Dropout are still removed).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.catalog import CompiledPattern, builtin_patterns
from autofusion.fusion_core.config import MeasureOptions, OptimizeConfig
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.patterns import NearMiss
from autofusion.fusion_core.pipeline.measured._decide import (
    FINAL_SHARE,
    Measuring,
    decide,
    decide_from_store,
)
from autofusion.fusion_core.pipeline.measured._groups import Decision, group_fusions
from autofusion.fusion_core.pipeline.measured._signature import measured_dims, pattern_hashes
from autofusion.fusion_core.pipeline.measured._store import VerdictStore
from autofusion.fusion_core.pipeline.measured._variants import PASSES, Variants, as_proto
from autofusion.fusion_core.pipeline.once import select_patterns
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.profiling import SLOWER, PairedTimer
from autofusion.fusion_core.profiling.verdicts import machine_class, machine_key
from autofusion.fusion_core.rewriters import RewriterRegistry

__all__ = ["optimize_measured"]

_CANNOT_RUN = (
    "the original model cannot run on generated inputs at any of the sizes tried: "
    "nothing measured, so no fusion is kept (give input sizes with --dim NAME=SIZE "
    "or a sample with --inputs)"
)
_FINAL_FLOOR = 0.05  # of the budget: the final comparison's least share (see the module doc)


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
    ``timer_factory`` replaces the timing (tests decide the ratios with it). ``config``
    is in measured mode (``OptimizeConfig.mode``; every variant is built with it, so
    ``config.proposer`` proposes and keeps what the cost model prices as a loss)."""
    if config.mode != "measured":  # config.mode refuses progressive with measured
        raise ConfigError(f"measured selection needs a measured config, not {config.mode!r}")
    started = time.perf_counter()
    opts = config.measure_options
    if patterns is None:  # compiled once, not again for every variant built
        patterns = builtin_patterns(registry)
    variants = Variants(as_proto(model), config, feeds, registry, patterns)
    proposal = variants.proposal()
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
        timer = (timer_factory or PairedTimer)(opts, Path(scratch))
        machine = machine_class(level=opts.level, threads=opts.threads, providers=timer.providers)
        store = VerdictStore.for_options(opts, machine_key(machine))
        if timer.feeds_for(variants.original, config, feeds) is None:
            # The check of the result says what cannot run, and how to give sizes.
            record["error"] = _CANNOT_RUN
            return _finish(variants.unchanged(), record, started, store, None)
        measuring = Measuring(
            timer,
            store,
            machine,
            machine_key(machine),
            config.target,
            pattern_hashes(select_patterns(config, registry, patterns)),
            measured_dims(proposal.model, timer.sample, timer.dims),
        )
        decisions = _measure_groups(variants, proposal, measuring)
        result = _keep_what_measured_faster(variants, decisions, measuring, record)
        record["groups"] = [d.to_dict() for d in decisions.values()]
    return _finish(result, record, started, store, measuring)


def _measure_groups(
    variants: Variants, proposal: Result, measuring: Measuring
) -> dict[str, Decision]:
    """A decision per group of the proposal, and of what leaving groups out exposes."""
    decisions: dict[str, Decision] = {}
    current = proposal
    # Leaving a group out can let a smaller form of it fuse in its place (BiasGelu
    # left out, Gelu fuses): such new groups are measured in turn, on the model
    # they appear in, for a few passes at most.
    for _ in range(PASSES):
        pending = [g for g in group_fusions(current.applied) if g.key not in decisions]
        if not pending:
            break
        decisions.update(decide(pending, current, variants.without, measuring))
        current = variants.decided(decisions, checked=False)
    # What the last pass exposed is left out unmeasured (unless the store decides it);
    # leaving it out can expose more (a merge left out lets the unmerged form of a kept
    # fusion match), so until the model built from these decisions applies no group
    # without one.
    reason = "measured selection: appeared when other groups were left out, unmeasured"
    for _ in range(PASSES):
        exposed = [g for g in group_fusions(current.applied) if g.key not in decisions]
        if not exposed:
            break
        stored, unmeasured = decide_from_store(exposed, current, measuring)
        decisions.update(stored)
        for group, signature, _ in unmeasured:
            decisions[group.key] = Decision(group, False, reason, signature=signature.signature)
        current = variants.decided(decisions, checked=False)
    return decisions


def _keep_what_measured_faster(
    variants: Variants, decisions: dict[str, Decision], measuring: Measuring, record: dict
) -> Result:
    """The model with the kept groups, measured against the original once more: when
    it is slower, the original as it came (and every decision says it was overruled)."""
    timer = measuring.timer
    started_build = time.perf_counter()
    result = variants.decided(decisions, checked=True)  # and its check
    timer.charge(-(time.perf_counter() - started_build))  # not timed against the budget
    share = min(FINAL_SHARE, max(measuring.timed_s / timer.budget, _FINAL_FLOOR))
    budget_s = min(timer.remaining(), timer.budget * share)
    final = timer.compare(result.to_proto(), variants.original, budget_s=budget_s)
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
    result = variants.unchanged()
    result.near_misses += [
        NearMiss(f.pattern, f.replaced_nodes, d.reason, "selection")
        for d in decisions.values()
        for f in d.group.fusions
    ]
    return result


def _finish(
    result: Result, record: dict, started: float, store: VerdictStore, measuring: Measuring | None
) -> Result:
    """The record's store counts and time; what was measured, in the local store and
    in ``Result.verdicts`` (``run()`` writes them for the service to keep)."""
    verdicts = list(measuring.verdicts) if measuring else []
    store.add(verdicts)
    matched, timed = (measuring.matched, measuring.timed) if measuring else (0, 0)
    record["store"] = store.summary(matched=matched, measured=timed)
    record["seconds"] = round(time.perf_counter() - started, 3)
    result.measurement = record
    result.verdicts = verdicts
    result.timings["measure"] = record["seconds"]
    return result
