"""Greedy selection: highest predicted gain first, skipping any candidate that overlaps
one already chosen. O(n log n) for the sort plus linear work in the node-set sizes.

Greedy is optimal when no two candidates overlap, and can lose otherwise: a candidate of
gain 10 overlapping two disjoint candidates of gain 6 each is taken (10), where the two
together give 12. ``dp`` and ``genetic`` maximise the same objective more carefully.
"""

from __future__ import annotations

from collections.abc import Iterable

from autofusion.fusion_core.strategies._candidates import Solution
from autofusion.fusion_core.strategies._conflicts import Problem
from autofusion.fusion_core.strategies._strategy import SelectionStrategy

__all__ = ["GreedyStrategy", "greedy_indices"]


def greedy_indices(problem: Problem, members: Iterable[int] | None = None) -> list[int]:
    """Greedy over ``members`` (default: all): gain descending, ties in input order."""
    if members is None:
        order = problem.rank
    else:
        order = sorted(members, key=problem.rank_position.__getitem__)
    taken: set[int] = set()
    chosen: list[int] = []
    for i in order:
        nodes = problem.candidates[i].node_ids
        if taken.isdisjoint(nodes):
            taken |= nodes
            chosen.append(i)
    return chosen


class GreedyStrategy(SelectionStrategy):
    """Highest gain first; ties broken by candidate order."""

    name = "greedy"

    def solve(self, problem: Problem) -> Solution:
        return Solution(greedy_indices(problem))
