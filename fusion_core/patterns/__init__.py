"""Patterns as data: the spec, its declarative constraints, and the matcher."""

from autofusion.fusion_core.patterns._attributes import attribute_value
from autofusion.fusion_core.patterns._constraints import Constraint
from autofusion.fusion_core.patterns._formula import Formula, FormulaError, compile_formula
from autofusion.fusion_core.patterns._match import NEAR_MISS_KINDS, Match, NearMiss
from autofusion.fusion_core.patterns._matcher import (
    Matcher,
    MatchResult,
    check_match,
    escape_reason,
)
from autofusion.fusion_core.patterns._refs import ValueRef, parse_edge, parse_ref
from autofusion.fusion_core.patterns._spec import (
    TARGET_NAMES,
    CostHints,
    NodeSpec,
    PatternSpec,
    RewriterRef,
    TargetName,
)

__all__ = [
    "NEAR_MISS_KINDS",
    "TARGET_NAMES",
    "TargetName",
    "Constraint",
    "CostHints",
    "Formula",
    "FormulaError",
    "Match",
    "MatchResult",
    "Matcher",
    "NearMiss",
    "NodeSpec",
    "PatternSpec",
    "RewriterRef",
    "ValueRef",
    "attribute_value",
    "check_match",
    "compile_formula",
    "escape_reason",
    "parse_edge",
    "parse_ref",
]
