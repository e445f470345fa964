"""The base of the cost-based strategies: filter, solve, complete, explain the rest.

Every strategy maximises the same objective, the total gain of a non-overlapping subset
of the candidates (``_candidates.py``), and returns a ``Selection``.

Filters applied first, by every strategy, in this order (the first that applies is the
candidate's reason):

- ``memory_limit`` (bytes): drop a candidate whose ``working_set`` exceeds it;
- ``cost_threshold``: drop a candidate whose predicted ``speedup`` is below it. The ratio
  convention is ``speedup = time before / time after``, so ``1.1`` means 10% faster and
  ``1.0`` means no change;
- a candidate whose gain is <= 0 can only lower the objective, so it is dropped.

A candidate without a ``working_set`` (or ``speedup``) passes the corresponding filter:
there is nothing to compare. After the strategy has solved, every kept candidate that
overlaps no chosen one is added (highest gain first), so each strategy returns a maximal
set and every kept, unchosen candidate is rejected as ``"conflict with <id>"``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.strategies._candidates import Candidate, Rejection, Selection, Solution
from autofusion.fusion_core.strategies._conflicts import Problem

__all__ = ["SelectionStrategy", "limit_rejection"]


class SelectionStrategy:
    """Base of the cost-based strategies: filters, calls ``solve``, explains the rest.

    Subclasses set ``name`` and implement ``solve(problem) -> Solution``; their tuning
    knobs are keyword-only constructor arguments.
    """

    name = "base"

    def __init__(
        self, *, cost_threshold: float | None = None, memory_limit: int | None = None
    ) -> None:
        if cost_threshold is not None and not (
            math.isfinite(cost_threshold) and cost_threshold > 0
        ):
            raise ConfigError(f"cost_threshold must be a positive ratio, got {cost_threshold!r}")
        if memory_limit is not None and memory_limit < 0:
            raise ConfigError(f"memory_limit must be >= 0 bytes, got {memory_limit!r}")
        self.cost_threshold = cost_threshold
        self.memory_limit = memory_limit

    def select(
        self,
        candidates: Sequence[Candidate],
        *,
        positions: Mapping[int, int] | None = None,
        op_count: int | None = None,
    ) -> Selection:
        """Choose a non-overlapping subset of ``candidates`` maximising the total gain.

        ``positions`` maps graph node ids to their index in a topological order (lets
        ``dp`` use interval DP); ``op_count`` is the graph's op count (used by ``auto``).
        """
        start = time.perf_counter()
        _check_unique_ids(candidates)
        reasons: dict[int, Rejection] = {}
        kept_index: list[int] = []
        for index, candidate in enumerate(candidates):
            rejection = self._filter(candidate)
            if rejection is None:
                kept_index.append(index)
            else:
                reasons[index] = rejection
        kept = [candidates[i] for i in kept_index]
        problem = Problem(kept, positions=positions, op_count=op_count)
        solution = self.solve(problem)
        chosen = _complete(problem, set(solution.chosen))
        for local, rejection in _conflict_rejections(problem, chosen).items():
            reasons[kept_index[local]] = rejection
        picked = [kept[i] for i in sorted(chosen)]
        no_conflict = all(r.kind != "conflict" for r in reasons.values())
        return Selection(
            strategy=self.name,
            chosen=tuple(picked),
            rejected=tuple(reasons[i] for i in sorted(reasons)),
            objective=math.fsum(c.gain for c in picked),
            seconds=time.perf_counter() - start,
            proven_optimal=solution.exact or no_conflict,
            notes=solution.notes,
            auto=solution.auto,
        )

    def solve(self, problem: Problem) -> Solution:
        raise NotImplementedError

    def _filter(self, candidate: Candidate) -> Rejection | None:
        rejection = limit_rejection(candidate, self.cost_threshold, self.memory_limit)
        if rejection is None and candidate.gain <= 0:
            return Rejection(candidate, "gain", "gain <= 0")
        return rejection


def limit_rejection(
    candidate: Candidate, cost_threshold: float | None, memory_limit: int | None
) -> Rejection | None:
    """The config's two limits, the same under every selection (priority included)."""
    working_set, speedup = candidate.working_set, candidate.speedup
    if memory_limit is not None and working_set is not None and working_set > memory_limit:
        reason = f"working set {working_set} bytes over memory_limit {memory_limit}"
        return Rejection(candidate, "memory_limit", reason)
    if cost_threshold is not None and speedup is not None and speedup < cost_threshold:
        reason = f"predicted speedup {speedup:.3g} below cost_threshold {cost_threshold:g}"
        return Rejection(candidate, "cost_threshold", reason)
    return None


def _check_unique_ids(candidates: Sequence[Candidate]) -> None:
    seen: set[str | int] = set()
    for candidate in candidates:
        if candidate.id in seen:
            raise ValueError(f"duplicate candidate id {candidate.id!r}")
        seen.add(candidate.id)


def _complete(problem: Problem, chosen: set[int]) -> set[int]:
    """Add, highest gain first, every candidate that overlaps nothing chosen."""
    taken: set[int] = set()
    for i in chosen:
        nodes = problem.candidates[i].node_ids
        if not taken.isdisjoint(nodes):  # a solver bug, never a user error
            raise RuntimeError(f"strategy chose overlapping candidates ({nodes & taken})")
        taken |= nodes
    for i in problem.rank:
        nodes = problem.candidates[i].node_ids
        if i not in chosen and taken.isdisjoint(nodes):
            chosen.add(i)
            taken |= nodes
    return chosen


def _conflict_rejections(problem: Problem, chosen: set[int]) -> dict[int, Rejection]:
    """Each unchosen candidate names the best-ranked chosen candidate it overlaps."""
    owner = {node: i for i in chosen for node in problem.candidates[i].node_ids}
    position = problem.rank_position
    out: dict[int, Rejection] = {}
    for i, candidate in enumerate(problem.candidates):
        if i in chosen:
            continue
        blockers = {owner[n] for n in candidate.node_ids if n in owner}
        other = problem.candidates[min(blockers, key=position.__getitem__)].id
        out[i] = Rejection(candidate, "conflict", f"conflict with {other}", other)
    return out
