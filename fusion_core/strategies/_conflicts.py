"""The conflict graph of the kept candidates, built lazily (greedy needs none of it).

Vertices are candidate indices; an edge joins two candidates whose node sets intersect.
Connected components of the conflict graph are exactly the groups of candidates linked
by shared graph nodes, so they are found by union-find over node ids in linear time.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property

import numpy as np

from autofusion.fusion_core.strategies._candidates import Candidate

__all__ = ["Problem"]


class Problem:
    """The kept candidates (input order) and what strategies derive from them."""

    def __init__(
        self,
        candidates: Sequence[Candidate],
        *,
        positions: Mapping[int, int] | None = None,
        op_count: int | None = None,
    ) -> None:
        self.candidates = list(candidates)
        self.gains = [c.gain for c in self.candidates]
        self.positions = positions
        self.op_count = op_count

    def __len__(self) -> int:
        return len(self.candidates)

    @cached_property
    def rank(self) -> list[int]:
        """Indices by gain descending; ties keep the input order."""
        return sorted(range(len(self.candidates)), key=lambda i: -self.gains[i])

    @cached_property
    def rank_position(self) -> list[int]:
        position = [0] * len(self.candidates)
        for pos, i in enumerate(self.rank):
            position[i] = pos
        return position

    @cached_property
    def components(self) -> list[list[int]]:
        """Connected components of the conflict graph, each sorted, in input order."""
        parent = list(range(len(self.candidates)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        owner: dict[int, int] = {}
        for i, candidate in enumerate(self.candidates):
            for node in candidate.node_ids:
                j = owner.setdefault(node, i)
                if j != i:
                    a, b = find(i), find(j)
                    if a != b:
                        parent[max(a, b)] = min(a, b)
        groups: dict[int, list[int]] = {}
        for i in range(len(self.candidates)):
            groups.setdefault(find(i), []).append(i)
        return list(groups.values())

    @cached_property
    def competing(self) -> list[list[int]]:
        """The components where more than one candidate competes."""
        return [c for c in self.components if len(c) > 1]

    @cached_property
    def adjacency(self) -> list[list[int]]:
        """Sorted neighbour lists of the conflict graph."""
        by_node: dict[int, list[int]] = {}
        for i, candidate in enumerate(self.candidates):
            for node in candidate.node_ids:
                by_node.setdefault(node, []).append(i)
        neighbours: list[set[int]] = [set() for _ in self.candidates]
        for group in by_node.values():
            if len(group) > 1:
                for i in group:
                    neighbours[i].update(group)
        return [sorted(n - {i}) for i, n in enumerate(neighbours)]

    def edges(self, members: Sequence[int]) -> np.ndarray:
        """The conflict edges inside ``members`` as an (E, 2) array of local indices."""
        local = {g: k for k, g in enumerate(members)}
        pairs = [
            (k, local[j])
            for k, g in enumerate(members)
            for j in self.adjacency[g]
            if j > g and j in local
        ]
        return np.asarray(pairs, dtype=np.int64).reshape(-1, 2)

    def edge_count(self, members: Sequence[int]) -> int:
        inside = set(members)
        return sum(1 for g in members for j in self.adjacency[g] if j > g and j in inside)
