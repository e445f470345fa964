"""The baseline strategy: highest pattern priority first, then earliest in the graph,
skipping any candidate that overlaps one already chosen.

A candidate whose nodes all belong to a higher-priority candidate skipped this round
waits too: it is a smaller form of a fusion that may apply in the next round, once
the rewrite that blocked it has changed the graph. (The Q/K/V merge, blocked by the
attention-scale fold on Q's projection, must not leave K and V to the two-way merge
meanwhile.) Every round still applies the top candidate, so rounds reach a fixpoint.
(Cost-based strategies that maximise predicted gain build on the same interface.)"""

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
        skipped: dict[int, list[frozenset[int]]] = {}  # node id -> skipped candidates
        for _, match in ranked:
            ids = frozenset(match.node_ids())
            if not taken.isdisjoint(ids):
                for node_id in ids:
                    skipped.setdefault(node_id, []).append(ids)
            elif not any(ids <= bigger for bigger in skipped.get(next(iter(ids)), ())):
                taken |= ids
                chosen.append(match)
        return chosen
