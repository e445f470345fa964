"""Strategies choose a non-overlapping subset of the candidates to rewrite."""

from autofusion.fusion_core.strategies._priority import PriorityStrategy
from autofusion.fusion_core.strategies._selection import (
    AutoChoice,
    Candidate,
    Rejection,
    Selection,
    SelectionStrategy,
    limit_rejection,
)
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
