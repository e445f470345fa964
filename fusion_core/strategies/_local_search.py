"""Greedy plus 1-swap local improvement, the fallback for components too big to solve
exactly. Two moves, each applied only when it strictly raises the total gain:

- *insert*: add one unchosen candidate and drop the chosen candidates it overlaps;
- *remove*: drop one chosen candidate and add, greedily, the candidates that only it
  was blocking (a 10 blocking two disjoint 6s becomes the two 6s).

Every move raises the objective, so the search ends; ``max_passes`` bounds it anyway.
"""

from __future__ import annotations

from collections.abc import Sequence

from autofusion.fusion_core.strategies._conflicts import Problem

__all__ = ["improve_by_swaps"]


class _State:
    def __init__(self, problem: Problem, chosen: Sequence[int]) -> None:
        self.adj = problem.adjacency
        self.gains = problem.gains
        self.chosen: set[int] = set()
        self.blockers: dict[int, int] = {}  # candidate -> number of chosen neighbours
        for i in chosen:
            self.add(i)

    def add(self, i: int) -> None:
        self.chosen.add(i)
        for j in self.adj[i]:
            self.blockers[j] = self.blockers.get(j, 0) + 1

    def remove(self, i: int) -> None:
        self.chosen.discard(i)
        for j in self.adj[i]:
            self.blockers[j] -= 1

    def fill(self, order: Sequence[int]) -> None:
        for i in order:
            if i not in self.chosen and not self.blockers.get(i, 0):
                self.add(i)

    def try_insert(self, i: int) -> set[int]:
        """Returns the candidates the move may have freed (empty: no move)."""
        lost = [j for j in self.adj[i] if j in self.chosen]
        if self.gains[i] <= sum(self.gains[j] for j in lost):
            return set()
        for j in lost:
            self.remove(j)
        self.add(i)
        return {k for j in lost for k in self.adj[j]}

    def try_remove(self, i: int, rank_position: Sequence[int]) -> set[int]:
        freed = [j for j in self.adj[i] if self.blockers.get(j) == 1 and j not in self.chosen]
        freed.sort(key=rank_position.__getitem__)
        picked: list[int] = []
        for j in freed:
            if all(k not in self.adj[j] for k in picked):
                picked.append(j)
        if sum(self.gains[j] for j in picked) <= self.gains[i]:
            return set()
        self.remove(i)
        for j in picked:
            self.add(j)
        return set(self.adj[i])


def improve_by_swaps(
    problem: Problem, members: Sequence[int], start: Sequence[int], *, max_passes: int = 100
) -> list[int]:
    """Improve the feasible set ``start`` within ``members`` by insert/remove moves."""
    inside = set(members)
    order = sorted(members, key=problem.rank_position.__getitem__)
    state = _State(problem, start)
    state.fill(order)
    for _ in range(max_passes):
        improved = False
        for i in order:
            if i in state.chosen:
                freed = state.try_remove(i, problem.rank_position)
            else:
                freed = state.try_insert(i)
            if freed:
                state.fill(sorted(freed & inside, key=problem.rank_position.__getitem__))
                improved = True
        if not improved:
            break
    state.fill(order)
    return sorted(state.chosen)
