"""A decision per group: from the verdict store, or the proposal timed against it without
the group.

A group whose region signature (``_signature.py``) has a confident combined verdict in
the store (``_store.py``: this machine class, fresh; ``combine_verdicts``) is decided
without timing: kept only when the combined verdict is "faster". The others are timed a
few at a time (``_BATCH`` variants beside the full model: sessions held in memory), each
batch given its share of what is left of the budget; a quarter of the budget stays for
the final comparison with the original. A group the budget does not reach is left out
(a fusion is kept only for a measured reason) and leaves no verdict. Each measurement
becomes a ``VerdictRecord`` of this run (``Measuring.verdicts``); nothing is overwritten:
a group whose stored measurements contradict each other is measured again, and the new
record joins them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import onnx

from autofusion.fusion_core.pipeline.measured._groups import (
    MEASURED,
    NOT_MEASURED,
    STORE,
    Decision,
    FusionGroup,
    SkipMap,
)
from autofusion.fusion_core.pipeline.measured._signature import RegionSignature, group_signature
from autofusion.fusion_core.pipeline.measured._store import VerdictStore
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.profiling import FASTER, PairedRatio, PairedTimer
from autofusion.fusion_core.profiling.verdicts import (
    CombinedVerdict,
    VerdictRecord,
    combine_verdicts,
)

__all__ = ["FINAL_SHARE", "Measuring", "decide", "decide_from_store", "evidence"]

_BATCH = 3  # variants timed beside the full model at once (sessions held in memory)
FINAL_SHARE = 0.25  # of the budget, kept for the final comparison with the original


@dataclass
class Measuring:
    """What deciding needs (the timer, the store, what verdicts are filed under) and
    what it found (the verdicts measured in this run, how many groups came from where)."""

    timer: PairedTimer
    store: VerdictStore
    machine: dict[str, Any]  # measuring_machine(level, threads)
    machine_key: str
    target: str
    hashes: Mapping[str, str]  # pattern name -> pattern_hash (_signature.py)
    dims: Mapping[str, int]  # the symbolic dims' sizes measured at
    verdicts: list[VerdictRecord] = field(default_factory=list)  # measured in this run
    matched: int = 0  # groups decided from the store
    timed: int = 0  # groups timed in this run
    timed_s: float = 0.0  # seconds the groups' timing took (variants built included)

    @property
    def where(self) -> str:
        opts = self.timer.opts
        return f"{opts.level}, {opts.threads} thread(s)"


def decide(
    pending: Sequence[FusionGroup],
    proposal: Result,
    without: Callable[[SkipMap], onnx.ModelProto],
    measuring: Measuring,
) -> dict[str, Decision]:
    """A decision per group of ``pending``: from the store, or ``proposal`` timed against
    ``without(group.skip(...))``, the proposal built without the group."""
    decisions, to_measure = decide_from_store(pending, proposal, measuring)
    if to_measure:
        decisions.update(_timed(to_measure, proposal.to_proto(), without, measuring))
    return decisions


def decide_from_store(
    pending: Sequence[FusionGroup], proposal: Result, measuring: Measuring
) -> tuple[dict[str, Decision], list[tuple[FusionGroup, RegionSignature, int]]]:
    """The decisions the store's confident verdicts give, and the groups left to time
    (with their signature and how many stored verdicts disagreed on them)."""
    decisions: dict[str, Decision] = {}
    to_measure: list[tuple[FusionGroup, RegionSignature, int]] = []
    for group in pending:
        signature = group_signature(group, proposal, measuring.hashes, measuring.dims)
        records = measuring.store.records_for(signature.signature)
        combined = combine_verdicts(records)
        if combined is not None and combined.confident:
            decisions[group.key] = _from_store(group, signature, combined, measuring)
        else:  # none, or contradicting: measured (again)
            to_measure.append((group, signature, len(records)))
    return decisions, to_measure


def _timed(
    to_measure: Sequence[tuple[FusionGroup, RegionSignature, int]],
    full: onnx.ModelProto,
    without: Callable[[SkipMap], onnx.ModelProto],
    measuring: Measuring,
) -> dict[str, Decision]:
    decisions: dict[str, Decision] = {}
    timer = measuring.timer
    phase_budget = timer.budget * (1 - FINAL_SHARE)
    for start in range(0, len(to_measure), _BATCH):
        batch = to_measure[start : start + _BATCH]
        left = phase_budget - timer.spent
        ratios: dict[str, PairedRatio] = {}
        if left > timer.least_cost(len(batch) + 1):
            began = timer.spent
            share = left * len(batch) / (len(to_measure) - start)
            variants = {g.key: without(g.skip("measured selection")) for g, _, _ in batch}
            ratios = timer.with_and_without(full, variants, budget_s=share)
            measuring.timed_s += timer.spent - began
        with_ms = timer.median_ms("full") if ratios else None
        for group, signature, disputed in batch:
            ratio = ratios.get(group.key)
            decisions[group.key] = _judged(group, signature, ratio, with_ms, disputed, measuring)
    return decisions


def _from_store(
    group: FusionGroup,
    signature: RegionSignature,
    combined: CombinedVerdict,
    measuring: Measuring,
) -> Decision:
    measuring.matched += 1
    ratio = combined.ratio
    kept = ratio.verdict == FASTER
    if kept:
        reason = f"measured faster (verdict store, {evidence(combined)}): with/without "
    else:
        reason = (
            f"measured selection: {ratio.verdict} on this machine class (verdict store, "
            f"{evidence(combined)}), with/without these fusions "
        )
    reason += f"{ratio.describe()}, {measuring.where}"
    return Decision(group, kept, reason, ratio, STORE, signature.signature, combined)


def evidence(combined: CombinedVerdict) -> str:
    """``3 measurements, jobs a1b2c3d4, c3d4e5f6`` (jobs: the service's; local runs have none)."""
    text = f"{combined.measurements} measurement{'s' if combined.measurements != 1 else ''}"
    if combined.jobs:
        text += ", jobs " + ", ".join(job[:8] for job in combined.jobs)
    return text


def _judged(
    group: FusionGroup,
    signature: RegionSignature,
    ratio: PairedRatio | None,
    with_ms: float | None,
    disputed: int,
    measuring: Measuring,
) -> Decision:
    """The decision a ratio says (None: not measured), its verdict kept when measured."""
    if ratio is None:
        reason = "measured selection: not measured within the time budget (--measure-budget)"
        return Decision(group, False, reason, source=NOT_MEASURED, signature=signature.signature)
    again = f"; the store's {disputed} measurement(s) disagreed" if disputed else ""
    if ratio.verdict == FASTER:
        reason = f"measured faster: with/without {ratio.describe()}, {measuring.where}{again}"
    else:
        reason = (
            f"measured selection: {ratio.verdict} on this machine, with/without these fusions "
            f"{ratio.describe()}, {measuring.where}{again}"
        )
    measuring.timed += 1
    record = _record(group, signature, ratio, with_ms, measuring)
    if record is not None:
        measuring.verdicts.append(record)
    kept = ratio.verdict == FASTER
    return Decision(group, kept, reason, ratio, MEASURED, signature.signature)


def _record(
    group: FusionGroup,
    signature: RegionSignature,
    ratio: PairedRatio,
    with_ms: float | None,
    measuring: Measuring,
) -> VerdictRecord | None:
    """The verdict of one measurement; None when it would not pass ``from_dict`` (a run
    too fast for the clock gives a zero ratio): a store would refuse it anyway."""
    record = VerdictRecord(
        signature=signature.signature,
        pattern=group.pattern,
        pattern_hash=signature.pattern_hash,
        group=group.key,
        region=signature.region,
        machine_key=measuring.machine_key,
        machine=measuring.machine,
        target=measuring.target,
        ratio=ratio,
        measured_at=datetime.now(UTC).isoformat(),
        with_ms=with_ms if with_ms and with_ms > 0 else None,
        predicted=group.predicted(),
    )
    try:
        return VerdictRecord.from_dict(record.to_dict())
    except ValueError:
        return None
