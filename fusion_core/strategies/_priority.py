"""The baseline strategy: highest pattern priority first, then earliest in the graph,
skipping any candidate that overlaps one already chosen. (Cost-based strategies that
maximise predicted gain build on the same interface.)"""

from __future__ import annotations

from collections.abc import Sequence

from fusion_core.patterns import Match

__all__ = ["PriorityStrategy"]


class PriorityStrategy:
    name = "priority"

    def select(self, candidates: Sequence[Match]) -> list[Match]:
        """A non-overlapping subset; ``candidates`` arrive in graph order."""
        ranked = sorted(
            enumerate(candidates), key=lambda item: (-item[1].pattern.priority, item[0])
        )
        taken: set[int] = set()
        chosen: list[Match] = []
        for _, match in ranked:
            ids = match.node_ids()
            if taken.isdisjoint(ids):
                taken |= ids
                chosen.append(match)
        return chosen
