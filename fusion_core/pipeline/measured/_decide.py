"""A decision per group: from the cache, or the proposal timed against it without the group.

Groups are timed a few at a time (``_BATCH`` variants beside the full model: sessions
held in memory), each batch given its share of what is left of the budget; a quarter of
the budget stays for the final comparison with the original. A group the budget does
not reach is left out: a fusion is kept only for a measured reason.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import onnx

from autofusion.fusion_core.pipeline.measured._groups import Decision, FusionGroup, SkipMap
from autofusion.fusion_core.pipeline.measured._measure_cache import DecisionCache
from autofusion.fusion_core.profiling import FASTER, PairedRatio, PairedTimer

__all__ = ["FINAL_SHARE", "Measuring", "decide"]

_BATCH = 3  # variants timed beside the full model at once (sessions held in memory)
FINAL_SHARE = 0.25  # of the budget, kept for the final comparison with the original


@dataclass(frozen=True)
class Measuring:
    """What deciding needs: the timer, and the cache with the keys decisions are filed by."""

    timer: PairedTimer
    cache: DecisionCache
    machine: dict[str, Any]  # _measure_cache.machine_class
    structure: str  # _measure_cache.model_structure

    def cache_key(self, group: FusionGroup) -> str:
        return self.cache.key(self.machine, self.structure, group.key)


def decide(
    pending: Sequence[FusionGroup],
    full: onnx.ModelProto,
    without: Callable[[SkipMap], onnx.ModelProto],
    measuring: Measuring,
) -> dict[str, Decision]:
    """A decision per group of ``pending``: from the cache, or ``full`` timed against
    ``without(group.skip(...))``, the proposal built without the group."""
    decisions: dict[str, Decision] = {}
    to_measure = []
    for group in pending:
        entry = measuring.cache.get(measuring.cache_key(group))
        if entry is None:
            to_measure.append(group)
            continue
        ratio = PairedRatio(**entry["ratio"]) if isinstance(entry.get("ratio"), dict) else None
        decisions[group.key] = Decision(group, entry["kept"], entry["reason"], ratio, cached=True)
    timer = measuring.timer
    phase_budget = timer.budget * (1 - FINAL_SHARE)
    for start in range(0, len(to_measure), _BATCH):
        batch = to_measure[start : start + _BATCH]
        left = phase_budget - timer.spent
        ratios: dict[str, PairedRatio] = {}
        if left > timer.least_cost(len(batch) + 1):
            share = left * len(batch) / (len(to_measure) - start)
            variants = {g.key: without(g.skip("measured selection")) for g in batch}
            ratios = timer.with_and_without(full, variants, budget_s=share)
        for group in batch:
            decisions[group.key] = _judged(group, ratios.get(group.key), measuring)
    return decisions


def _judged(group: FusionGroup, ratio: PairedRatio | None, measuring: Measuring) -> Decision:
    """The decision a ratio says (None: not measured), filed in the cache when measured."""
    opts = measuring.timer.opts
    where = f"{opts.level}, {opts.threads} thread(s)"
    if ratio is None:
        reason = "measured selection: not measured within the time budget (--measure-budget)"
        return Decision(group, False, reason)
    if ratio.verdict == FASTER:
        decision = Decision(
            group, True, f"measured faster: with/without {ratio.describe()}, {where}", ratio
        )
    else:
        reason = (
            f"measured selection: {ratio.verdict} on this machine, with/without these fusions "
            f"{ratio.describe()}, {where}"
        )
        decision = Decision(group, False, reason, ratio)
    entry = {"kept": decision.kept, "reason": decision.reason, "ratio": ratio.to_dict()}
    measuring.cache.put(measuring.cache_key(group), entry)
    return decision
