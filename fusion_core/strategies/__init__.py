"""Strategies choose a non-overlapping subset of the candidates to rewrite.

``_candidates.py`` holds the data (``Candidate`` in, ``Selection`` out, a ``Rejection``
for every candidate not chosen); ``_strategy.py`` the base every cost-based strategy
builds on; ``_conflicts.py`` the conflict graph. ``pricing.py`` ties a strategy to the
cost model and the config (the selection a pass of the pipeline runs); it is not in
this face, which imports no cost model.
"""

from autofusion.fusion_core.strategies._candidates import (
    AutoChoice,
    Candidate,
    Rejection,
    Selection,
)
from autofusion.fusion_core.strategies._priority import PriorityStrategy
from autofusion.fusion_core.strategies._strategy import SelectionStrategy, limit_rejection
from autofusion.fusion_core.strategies.auto import STRATEGIES, AutoStrategy, strategy_by_name
from autofusion.fusion_core.strategies.dp import DPStrategy
from autofusion.fusion_core.strategies.genetic import GeneticStrategy
from autofusion.fusion_core.strategies.greedy import GreedyStrategy

__all__ = [
    "STRATEGIES",
    "AutoChoice",
    "AutoStrategy",
    "Candidate",
    "DPStrategy",
    "GeneticStrategy",
    "GreedyStrategy",
    "PriorityStrategy",
    "Rejection",
    "Selection",
    "SelectionStrategy",
    "limit_rejection",
    "strategy_by_name",
]
