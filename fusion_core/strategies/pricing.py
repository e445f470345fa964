"""The selection a pass runs: a strategy tied to the cost model and the config's limits.

``selection_for(config)`` gives the one ``config.proposer`` names. The pipeline's
default (``OptimizeConfig.selection = "priority"``) takes candidates by pattern
priority. With ``greedy``, ``dp``, ``genetic`` or ``auto`` each round instead prices
every candidate with ``fusion_core.cost.CostModel`` (the target profile's bandwidth,
launch overhead and peak FLOP/s over the inferred shapes, or the pattern's cost hints
when shapes are unknown) and hands them to the strategy, which maximises the total
predicted gain of a non-overlapping set (``fusion_core.strategies``).
``cost_threshold`` and ``memory_limit`` drop candidates before the choice under every
selection, priority included (``PrioritySelection``), and outside measured mode every
selection leaves out what the cost model prices as a loss (``CostModel.loss_reason``;
in measured mode this machine decides); those drops become near misses with their
reason. Each round's objective, chosen and rejected candidates and the strategy's time
are kept in ``Result.selections``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.cost import CostModel, Gain
from autofusion.fusion_core.patterns import Match, NearMiss
from autofusion.fusion_core.rewriters import RewriterRegistry
from autofusion.fusion_core.strategies import (
    Candidate,
    PriorityStrategy,
    limit_rejection,
    strategy_by_name,
)

__all__ = ["CostBasedSelection", "PrioritySelection", "selection_for"]

_FILTERS = ("cost_threshold", "memory_limit")


class CostBasedSelection:
    """Prices every candidate and lets the strategy choose; the same interface as
    ``PrioritySelection``, plus each round's record of what it decided and why."""

    def __init__(
        self, config: OptimizeConfig, *, op_count: int, rewriters: RewriterRegistry | None = None
    ) -> None:
        self.name = config.proposer
        dims = config.check.shape_profiles()[0]
        self.cost = CostModel(config.target_profile, dims=dims, rewriters=rewriters)
        self.strategy = strategy_by_name(
            config.proposer,
            cost_threshold=config.cost_threshold,
            memory_limit=config.memory_limit,
        )
        self.op_count = op_count
        self.positions: Mapping[int, int] | None = None
        self.records: list[dict[str, Any]] = []
        self.dropped: list[NearMiss] = []  # threshold and memory-limit rejections

    def select(self, candidates: Sequence[Match]) -> list[Match]:
        priced = []
        for index, match in enumerate(candidates):
            gain = self.cost.candidate_gain(match)
            priced.append(
                Candidate(
                    index,
                    match.node_ids(),
                    gain.gain_s if math.isfinite(gain.gain_s) else 0.0,
                    gain.working_set_bytes,
                    gain.speedup,
                    payload=(match, gain),
                )
            )
        selection = self.strategy.select(priced, positions=self.positions, op_count=self.op_count)
        for rejection in selection.rejected:
            match, gain = rejection.candidate.payload
            reason = rejection.reason if rejection.kind in _FILTERS else None
            if rejection.kind == "gain":  # a predicted loss says why; a zero gain is no news
                reason = self.cost.loss_reason(gain)
            if reason is not None:
                reason = f"{self.name} selection: {reason}"
                self.dropped.append(
                    NearMiss(match.pattern.name, tuple(match.node_names()), reason, "selection")
                )
        self.records.append(
            {
                "strategy": selection.strategy,
                "objective_s": selection.objective,
                "seconds": selection.seconds,
                "proven_optimal": selection.proven_optimal,
                "chosen": [_describe(c) for c in selection.chosen],
                "rejected": [
                    {**_describe(r.candidate), "reason": r.reason} for r in selection.rejected
                ],
                "notes": list(selection.notes),
                "auto": selection.auto.to_dict() if selection.auto else None,
            }
        )
        return [c.payload[0] for c in selection.chosen]


class PrioritySelection:
    """Pattern priority (``PriorityStrategy``) over the candidates the cost model does
    not price as a loss and the config's ``cost_threshold`` and ``memory_limit`` leave;
    the same interface as ``CostBasedSelection``. Each one left out becomes a near miss
    that says why.

    ``drop_losses=False`` (measured selection's proposal) keeps the predicted losses:
    the profile's kernel factors were fitted on one machine class, and measuring on
    this one is what decides there."""

    def __init__(
        self,
        config: OptimizeConfig,
        *,
        drop_losses: bool = True,
        rewriters: RewriterRegistry | None = None,
    ) -> None:
        self.name = "priority"
        dims = config.check.shape_profiles()[0]
        self.cost = CostModel(config.target_profile, dims=dims, rewriters=rewriters)
        self.cost_threshold, self.memory_limit = config.cost_threshold, config.memory_limit
        self.drop_losses = drop_losses
        self.positions: Mapping[int, int] | None = None
        self.records: list[dict[str, Any]] = []  # priority keeps no per-round record
        self.dropped: list[NearMiss] = []
        self._priority = PriorityStrategy()

    def select(self, candidates: Sequence[Match]) -> list[Match]:
        kept = []
        for index, match in enumerate(candidates):
            gain, reason = self._left_out_because(match)
            if reason is None:
                kept.append(_candidate(index, match, gain, priority=match.pattern.priority))
            else:
                reason = f"priority selection: {reason}"
                self.dropped.append(
                    NearMiss(match.pattern.name, tuple(match.node_names()), reason, "selection")
                )
        # in priority order: the order the pipeline applies them in
        return [c.payload for c in self._priority.select(kept).chosen]

    def _left_out_because(self, match: Match) -> tuple[Gain | None, str | None]:
        """The candidate's predicted gain (None when not priced) and why it is left out."""
        if not self.drop_losses and self.cost_threshold is None and self.memory_limit is None:
            return None, None  # nothing to price against: skip the cost model
        gain = self.cost.candidate_gain(match)
        if self.drop_losses and (loss := self.cost.loss_reason(gain)) is not None:
            return gain, loss
        rejection = limit_rejection(_candidate(0, match, gain), self.cost_threshold,
                                    self.memory_limit)  # fmt: skip
        return gain, None if rejection is None else rejection.reason


def _candidate(index: int, match: Match, gain: Gain | None, *, priority: int = 0) -> Candidate:
    if gain is None:
        return Candidate(index, match.node_ids(), 0.0, payload=match, priority=priority)
    return Candidate(
        index,
        match.node_ids(),
        gain.gain_s if math.isfinite(gain.gain_s) else 0.0,
        gain.working_set_bytes,
        gain.speedup,
        payload=match,
        priority=priority,
    )


def selection_for(
    config: OptimizeConfig, *, op_count: int, rewriters: RewriterRegistry | None = None
) -> PrioritySelection | CostBasedSelection:
    """The selection ``config.proposer`` names; ``rewriters`` (default: the built-in ones)
    say what each rewrite costs. In measured mode priority keeps the predicted losses."""
    if config.proposer == "priority":
        drop = config.mode != "measured"
        return PrioritySelection(config, drop_losses=drop, rewriters=rewriters)
    return CostBasedSelection(config, op_count=op_count, rewriters=rewriters)


def _describe(candidate: Candidate) -> dict[str, Any]:
    match, gain = candidate.payload
    return {
        "pattern": match.pattern.name,
        "nodes": list(match.node_names()),
        "gain_s": gain.gain_s,
        "speedup": gain.speedup,
        "estimated_from": gain.estimated_from,
    }
