"""Patterns as data: the spec, its declarative constraints, formulas, and the matcher.

The names load on first use (``lazy_loader``, as the ``fusion_core`` face does): a
config that validates a switch's condition (``compile_condition``, ``_formula.py``)
loads no onnx, onnx-ir or numpy; the matcher and the constraints load them.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_attributes": ["attribute_value"],
        "_constraints": ["Constraint"],
        "_formula": [
            "Condition",
            "Formula",
            "FormulaError",
            "compile_condition",
            "compile_formula",
        ],
        "_match": ["Match"],
        "_near_miss": ["NEAR_MISS_KINDS", "NearMiss"],
        "_matcher": ["Matcher", "MatchResult", "check_match", "escape_reason"],
        "_refs": ["ValueRef", "parse_edge", "parse_ref"],
        "_spec": [
            "TARGET_NAMES",
            "CostHints",
            "NodeSpec",
            "PatternSpec",
            "RewriterRef",
            "TargetName",
        ],
    },
)
