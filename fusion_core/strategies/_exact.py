"""Exact maximum-weight independent set solvers for one conflict component.

Each takes the component's members (indices into ``Problem.candidates``), all with gain
> 0, and returns the chosen members, or None when its structure does not apply.

- ``solve_interval``: every candidate covers a contiguous range of topological
  positions (positions distinct per node), so two candidates conflict exactly when
  their ranges intersect: weighted interval scheduling, O(n log n).
- ``solve_tree``: the conflict graph is a tree (n - 1 edges, connected): tree DP, O(n).
- ``solve_search``: branch and bound over bitmasks, any graph. Isolated vertices are
  taken, a degree-1 vertex at least as heavy as its neighbour is taken, disconnected
  parts are solved apart, otherwise it branches on a vertex of maximum degree; the drop
  branch is pruned when the take branch already reaches the upper bound (the sum of the
  remaining gains). Results are memoised per remaining set. Returns None past ``budget``
  search nodes.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from autofusion.fusion_core.strategies._conflicts import Problem

__all__ = ["interval_ranges", "solve_interval", "solve_search", "solve_tree"]


def interval_ranges(
    problem: Problem, members: Sequence[int], positions: Mapping[int, int]
) -> list[tuple[int, int]] | None:
    """Each member's (first, last) position, or None unless all are contiguous ranges."""
    ranges: list[tuple[int, int]] = []
    seen: dict[int, int] = {}  # position -> node: positions must be distinct
    for i in members:
        nodes = problem.candidates[i].node_ids
        pos = [positions.get(n) for n in nodes]
        if None in pos:
            return None
        for p, n in zip(pos, nodes, strict=True):
            if seen.setdefault(p, n) != n:
                return None
        lo, hi = min(pos), max(pos)
        if hi - lo + 1 != len(nodes):
            return None
        ranges.append((lo, hi))
    return ranges


def solve_interval(
    problem: Problem, members: Sequence[int], positions: Mapping[int, int] | None
) -> list[int] | None:
    """Weighted interval scheduling when every member is a contiguous position range."""
    ranges = None if positions is None else interval_ranges(problem, members, positions)
    if ranges is None:
        return None
    order = sorted(range(len(members)), key=lambda k: (ranges[k][1], k))
    ends = [ranges[k][1] for k in order]
    best = [0.0] * (len(order) + 1)  # best[j]: optimum over the first j by end
    take = [False] * len(order)
    prev = [0] * len(order)
    for j, k in enumerate(order):
        prev[j] = bisect.bisect_left(ends, ranges[k][0], 0, j)  # those ending before start
        with_k = problem.gains[members[k]] + best[prev[j]]
        take[j] = with_k > best[j]
        best[j + 1] = with_k if take[j] else best[j]
    chosen: list[int] = []
    j = len(order)
    while j > 0:
        if take[j - 1]:
            chosen.append(members[order[j - 1]])
            j = prev[j - 1]
        else:
            j -= 1
    return sorted(chosen)


def solve_tree(problem: Problem, members: Sequence[int]) -> list[int] | None:
    """Tree DP when the component's conflict graph is a tree."""
    if problem.edge_count(members) != len(members) - 1:
        return None
    adj, gains = problem.adjacency, problem.gains
    root = members[0]
    parent = {root: -1}
    order = [root]
    for v in order:  # breadth-first; ``order`` grows while iterating
        for u in adj[v]:
            if u not in parent:
                parent[u] = v
                order.append(u)
    take = {v: gains[v] for v in order}
    skip = dict.fromkeys(order, 0.0)
    for v in reversed(order[1:]):
        p = parent[v]
        take[p] += skip[v]
        skip[p] += max(take[v], skip[v])
    chosen: set[int] = set()
    for v in order:
        if parent[v] not in chosen and take[v] > skip[v]:
            chosen.add(v)
    return sorted(chosen)


class _OverBudget(Exception):
    pass


def _bits(mask: int):
    while mask:
        low = mask & -mask
        yield low.bit_length() - 1
        mask ^= low


class _Search:
    def __init__(self, weights: list[float], nbr: list[int], budget: int) -> None:
        self.w, self.nbr, self.budget = weights, nbr, budget
        self.memo: dict[int, tuple[float, int]] = {0: (0.0, 0)}

    def part(self, mask: int) -> int:
        """The connected part of ``mask`` holding its lowest vertex."""
        part = frontier = mask & -mask
        while frontier:
            reach = 0
            for v in _bits(frontier):
                reach |= self.nbr[v]
            frontier = reach & mask & ~part
            part |= frontier
        return part

    def best(self, mask: int) -> tuple[float, int]:
        hit = self.memo.get(mask)
        if hit is not None:
            return hit
        self.budget -= 1
        if self.budget < 0:
            raise _OverBudget
        part = self.part(mask)
        if part != mask:
            a, b = self.best(part), self.best(mask & ~part)
            result = (a[0] + b[0], a[1] | b[1])
        else:
            result = self.branch(mask)
        self.memo[mask] = result
        return result

    def branch(self, mask: int) -> tuple[float, int]:
        w, nbr = self.w, self.nbr
        degree = {v: (nbr[v] & mask).bit_count() for v in _bits(mask)}
        for v, d in degree.items():
            only = nbr[v] & mask
            if d == 0 or (d == 1 and w[v] >= w[only.bit_length() - 1]):
                rest = self.best(mask & ~(1 << v) & ~only)
                return (rest[0] + w[v], rest[1] | 1 << v)
        v = max(degree, key=lambda u: (degree[u], w[u]))
        rest = self.best(mask & ~(1 << v) & ~nbr[v])
        take = (rest[0] + w[v], rest[1] | 1 << v)
        bound = sum(w[u] for u in _bits(mask & ~(1 << v)))
        if take[0] >= bound:
            return take
        drop = self.best(mask & ~(1 << v))
        return take if take[0] >= drop[0] else drop


def solve_search(problem: Problem, members: Sequence[int], *, budget: int) -> list[int] | None:
    """Exact branch and bound; None when it needs more than ``budget`` search nodes."""
    local = {g: k for k, g in enumerate(members)}
    nbr = [0] * len(members)
    for k, g in enumerate(members):
        for j in problem.adjacency[g]:
            if j in local:
                nbr[k] |= 1 << local[j]
    search = _Search([problem.gains[g] for g in members], nbr, budget)
    try:
        _, mask = search.best((1 << len(members)) - 1)
    except _OverBudget:
        return None
    return [members[k] for k in _bits(mask)]
