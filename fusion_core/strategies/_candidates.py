"""The selection problem's data, shared by every strategy: candidates in, a selection out.

A :class:`Candidate` is a fusion the matcher found: an id, the graph-node ids it would
replace and a predicted gain (seconds saved; may be <= 0). Two candidates *conflict*
when their node sets intersect. A strategy returns a :class:`Selection`: the chosen
candidates, and a :class:`Rejection` with its reason for every other one. A solver
returns a :class:`Solution` (indices), and ``auto`` says what it chose in an
:class:`AutoChoice`.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["AutoChoice", "Candidate", "Rejection", "Selection", "Solution"]


@dataclass(frozen=True)
class Candidate:
    """One fusion the matcher found. ``payload`` (e.g. the ``Match``) is carried along."""

    id: str | int
    node_ids: frozenset[int]
    gain: float
    working_set: int | None = None
    speedup: float | None = None
    payload: Any = field(default=None, compare=False, repr=False)
    priority: int = 0  # the pattern's: what the priority strategy ranks by

    def __post_init__(self) -> None:
        object.__setattr__(self, "node_ids", frozenset(self.node_ids))
        if not self.node_ids:
            raise ValueError(f"candidate {self.id!r} replaces no node")
        if not math.isfinite(self.gain):
            raise ValueError(f"candidate {self.id!r} has a non-finite gain {self.gain!r}")
        if self.speedup is not None and not self.speedup > 0:
            raise ValueError(f"candidate {self.id!r} has speedup {self.speedup!r}, not > 0")
        if self.working_set is not None and self.working_set < 0:
            raise ValueError(f"candidate {self.id!r} has a negative working set")

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "node_ids": sorted(self.node_ids),
            "gain": self.gain,
            "working_set": self.working_set,
            "speedup": self.speedup,
        }


@dataclass(frozen=True)
class Rejection:
    """Why a candidate was not chosen. ``kind`` is one of ``conflict``, ``memory_limit``,
    ``cost_threshold``, ``gain`` (or, under priority, ``waits``: a smaller form of a
    blocked fusion); ``conflict_with`` names the chosen candidate in the way."""

    candidate: Candidate
    kind: str
    reason: str
    conflict_with: str | int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.candidate.id,
            "kind": self.kind,
            "reason": self.reason,
            "conflict_with": self.conflict_with,
        }


@dataclass(frozen=True)
class AutoChoice:
    """Which strategy ``auto`` ran and why, with the measurements it decided on."""

    strategy: str
    reason: str
    op_count: int
    candidates: int
    competing_components: int
    largest_component: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "reason": self.reason,
            "op_count": self.op_count,
            "candidates": self.candidates,
            "competing_components": self.competing_components,
            "largest_component": self.largest_component,
        }


@dataclass(frozen=True)
class Selection:
    """The chosen candidates and, for every other one, why not (both in input order)."""

    strategy: str
    chosen: tuple[Candidate, ...]
    rejected: tuple[Rejection, ...]
    objective: float
    seconds: float
    proven_optimal: bool
    notes: tuple[str, ...] = ()
    auto: AutoChoice | None = None

    @property
    def chosen_ids(self) -> list[str | int]:
        return [c.id for c in self.chosen]

    def reason_for(self, candidate_id: str | int) -> str | None:
        """The rejection reason of a candidate, or None when it was chosen or unknown."""
        return next((r.reason for r in self.rejected if r.candidate.id == candidate_id), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "strategy": self.strategy,
            "objective": self.objective,
            "seconds": self.seconds,
            "proven_optimal": self.proven_optimal,
            "chosen": [c.to_dict() for c in self.chosen],
            "rejected": [r.to_dict() for r in self.rejected],
            "notes": list(self.notes),
            "auto": self.auto.to_dict() if self.auto else None,
        }


@dataclass(frozen=True)
class Solution:
    """What a strategy's solver returns: indices into ``Problem.candidates``."""

    chosen: Iterable[int]
    exact: bool = False
    notes: tuple[str, ...] = ()
    auto: AutoChoice | None = None
