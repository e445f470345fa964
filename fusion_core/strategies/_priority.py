"""The baseline strategy: highest pattern priority first, then earliest in the graph,
skipping any candidate that overlaps one already chosen.

A candidate whose nodes all belong to a higher-priority candidate skipped this round
waits too: it is a smaller form of a fusion that may apply in the next round, once
the rewrite that blocked it has changed the graph. (The Q/K/V merge, blocked by the
attention-scale fold on Q's projection, must not leave K and V to the two-way merge
meanwhile.) Every round still applies the top candidate, so rounds reach a fixpoint.

It takes and returns what every strategy does (``Candidate`` in, ``Selection`` out),
ranking by ``Candidate.priority``. Unlike the cost-based strategies it applies no
filter of its own: ``fusion_core.strategies.pricing.PrioritySelection`` leaves out
the predicted losses and what the config's limits refuse, with the reasons, first.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence

from autofusion.fusion_core.strategies._candidates import Candidate, Rejection, Selection

__all__ = ["PriorityStrategy"]


class PriorityStrategy:
    name = "priority"

    def select(
        self,
        candidates: Sequence[Candidate],
        *,
        positions: Mapping[int, int] | None = None,
        op_count: int | None = None,
    ) -> Selection:
        """A non-overlapping subset; ``candidates`` arrive in graph order."""
        start = time.perf_counter()
        ranked = sorted(enumerate(candidates), key=lambda item: (-item[1].priority, item[0]))
        owner: dict[int, Candidate] = {}  # node id -> the chosen candidate holding it
        chosen: list[Candidate] = []
        rejected: list[Rejection] = []
        skipped: dict[int, list[frozenset[int]]] = {}  # node id -> skipped candidates
        for _, candidate in ranked:
            ids = candidate.node_ids
            if not owner.keys().isdisjoint(ids):
                blocker = next(owner[i] for i in sorted(ids) if i in owner)
                rejected.append(
                    Rejection(candidate, "conflict", f"conflict with {blocker.id}", blocker.id)
                )
                for node_id in ids:
                    skipped.setdefault(node_id, []).append(ids)
            elif any(ids <= bigger for bigger in skipped.get(next(iter(ids)), ())):
                reason = "waits: a larger fusion over its nodes was blocked this round"
                rejected.append(Rejection(candidate, "waits", reason))
            else:
                owner.update(dict.fromkeys(ids, candidate))
                chosen.append(candidate)
        return Selection(
            strategy=self.name,
            chosen=tuple(chosen),
            rejected=tuple(rejected),
            objective=math.fsum(c.gain for c in chosen),
            seconds=time.perf_counter() - start,
            proven_optimal=False,
        )
