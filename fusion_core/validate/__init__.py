"""Validation: does the fused model still compute what the original computed?"""

from fusion_core.validate._compare import (
    CANNOT_LOAD,
    FUSED_CANNOT_RUN,
    MISMATCH,
    ORIGINAL_CANNOT_RUN,
    CheckResult,
    OutputCheck,
    ProfileCheck,
    compare_models,
    make_session,
)
from fusion_core.validate._dims import CANDIDATES, candidate_dims, input_dims
from fusion_core.validate._inputs import (
    FloatDistribution,
    InputSpec,
    describe_inputs,
    random_inputs,
)
from fusion_core.validate._stats import HISTOGRAM_EDGES, ErrorStats, Tolerance, default_tolerance
from fusion_core.validate._user_inputs import check_feeds, load_inputs

__all__ = [
    "CANDIDATES",
    "CANNOT_LOAD",
    "FUSED_CANNOT_RUN",
    "HISTOGRAM_EDGES",
    "MISMATCH",
    "ORIGINAL_CANNOT_RUN",
    "CheckResult",
    "ErrorStats",
    "FloatDistribution",
    "InputSpec",
    "OutputCheck",
    "ProfileCheck",
    "Tolerance",
    "candidate_dims",
    "check_feeds",
    "compare_models",
    "default_tolerance",
    "describe_inputs",
    "input_dims",
    "load_inputs",
    "make_session",
    "random_inputs",
]
