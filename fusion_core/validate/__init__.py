"""Validation: does the fused model still compute what the original computed?"""

from fusion_core.validate._compare import CheckResult, OutputCheck, compare_models, make_session
from fusion_core.validate._inputs import random_inputs

__all__ = ["CheckResult", "OutputCheck", "compare_models", "make_session", "random_inputs"]
