"""Exact selection: maximum-weight independent set on the conflict graph.

The conflict graph is split into connected components, each solved on its own (the
optimum is the union of the components' optima). Per component, the first that applies:

1. one candidate: take it;
2. ``interval``: with ``positions`` (node id -> topological index), when every candidate
   covers a contiguous range of positions, weighted interval scheduling, O(n log n);
3. ``tree``: the conflict graph is a tree, tree DP, O(n);
4. ``search``: up to ``exact_limit`` candidates, exact branch and bound within
   ``search_budget`` search nodes;
5. otherwise the fallback, greedy plus 1-swap local improvement, which is *not* proven
   optimal: the result says so in ``notes`` and ``proven_optimal`` is False.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.strategies._candidates import Solution
from autofusion.fusion_core.strategies._conflicts import Problem
from autofusion.fusion_core.strategies._exact import (
    interval_ranges,
    solve_interval,
    solve_search,
    solve_tree,
)
from autofusion.fusion_core.strategies._local_search import improve_by_swaps
from autofusion.fusion_core.strategies._strategy import SelectionStrategy
from autofusion.fusion_core.strategies.greedy import greedy_indices

__all__ = ["DPStrategy"]

MAX_EXACT_LIMIT = 256  # the bitmask search recurses about once per candidate


class DPStrategy(SelectionStrategy):
    """Exact per conflict component where the size or structure allows it."""

    name = "dp"

    def __init__(
        self,
        *,
        exact_limit: int = 40,
        search_budget: int = 200_000,
        cost_threshold: float | None = None,
        memory_limit: int | None = None,
    ) -> None:
        super().__init__(cost_threshold=cost_threshold, memory_limit=memory_limit)
        if not 1 <= exact_limit <= MAX_EXACT_LIMIT:
            raise ConfigError(f"exact_limit must be in 1..{MAX_EXACT_LIMIT}, got {exact_limit}")
        if search_budget < 1:
            raise ConfigError(f"search_budget must be >= 1, got {search_budget}")
        self.exact_limit = exact_limit
        self.search_budget = search_budget

    def structure(self, problem: Problem, members: Sequence[int]) -> str | None:
        """How a component can be solved exactly without trying: ``single``,
        ``interval``, ``tree`` or ``search`` (within the size bound); None: over it."""
        if len(members) == 1:
            return "single"
        positions = problem.positions
        if positions is not None and interval_ranges(problem, members, positions) is not None:
            return "interval"
        if problem.edge_count(members) == len(members) - 1:
            return "tree"
        return "search" if len(members) <= self.exact_limit else None

    def solve(self, problem: Problem) -> Solution:
        chosen: list[int] = []
        methods: Counter[str] = Counter()
        fallbacks: list[str] = []
        for members in problem.components:
            picked, method = self._solve_component(problem, members)
            chosen.extend(picked)
            methods[method] += 1
            if method == "greedy+1-swap":
                fallbacks.append(self._fallback_note(len(members)))
        summary = ", ".join(f"{count} by {method}" for method, count in sorted(methods.items()))
        notes = (f"components solved: {summary}", *fallbacks) if methods else ()
        return Solution(chosen, exact=not fallbacks, notes=notes)

    def _fallback_note(self, size: int) -> str:
        if size > self.exact_limit:
            why = f"over the exact bound {self.exact_limit} (no interval or tree structure)"
        else:
            why = f"over the search_budget {self.search_budget}"
        return f"component of {size} candidates {why}: greedy+1-swap, not proven optimal"

    def _solve_component(self, problem: Problem, members: list[int]) -> tuple[list[int], str]:
        if len(members) == 1:
            return members, "single"
        picked = solve_interval(problem, members, problem.positions)
        if picked is not None:
            return picked, "interval DP"
        picked = solve_tree(problem, members)
        if picked is not None:
            return picked, "tree DP"
        if len(members) <= self.exact_limit:
            picked = solve_search(problem, members, budget=self.search_budget)
            if picked is not None:
                return picked, "branch-and-bound"
        start = greedy_indices(problem, members)
        return improve_by_swaps(problem, members, start), "greedy+1-swap"
