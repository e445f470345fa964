"""Strategies choose a non-overlapping subset of the candidates to rewrite."""

from fusion_core.strategies._priority import PriorityStrategy

__all__ = ["PriorityStrategy"]
