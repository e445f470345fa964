"""Validation: does the fused model still compute what the original computed?"""

from autofusion.fusion_core.validate._compare import compare_models
from autofusion.fusion_core.validate._dims import (
    CANDIDATES,
    candidate_dims,
    evaluate_dim,
    input_dims,
)
from autofusion.fusion_core.validate._exact import EXACT_LEVEL, ExactCheck, ExactOutput
from autofusion.fusion_core.validate._floor import (
    FLOAT16,
    FLOOR_MULTIPLE,
    PERTURBATION,
    NoiseFloor,
    OutputFloor,
    activation_quantizers,
)
from autofusion.fusion_core.validate._floor_fp16 import (
    FLOAT16_MULTIPLE,
    float16_parts,
    in_float32,
)
from autofusion.fusion_core.validate._inputs import (
    FloatDistribution,
    InputSpec,
    describe_inputs,
    random_inputs,
)
from autofusion.fusion_core.validate._ranges import PrecisionReport, check_fp16
from autofusion.fusion_core.validate._regions import (
    RegionReport,
    compare_regions,
    fused_regions,
    tensor_diffs,
)
from autofusion.fusion_core.validate._result import (
    CANNOT_LOAD,
    FAILURE_WORDS,
    FUSED_CANNOT_RUN,
    INVALID_GRAPH,
    MISMATCH,
    ORIGINAL_CANNOT_RUN,
    CheckResult,
    OutputCheck,
    ProfileCheck,
    describe_failure,
)
from autofusion.fusion_core.validate._session_file import MIN_COPY_BYTES, session_file
from autofusion.fusion_core.validate._sessions import ModelFile, make_session
from autofusion.fusion_core.validate._stats import (
    HISTOGRAM_EDGES,
    ErrorStats,
    Tolerance,
    default_tolerance,
)
from autofusion.fusion_core.validate._steps import cycle_members, emitted_problems
from autofusion.fusion_core.validate._structure import (
    OutputSignature,
    checker_problems,
    output_signature,
    structure_problems,
)
from autofusion.fusion_core.validate._user_inputs import check_feeds, load_inputs

__all__ = [
    "CANDIDATES",
    "CANNOT_LOAD",
    "EXACT_LEVEL",
    "FAILURE_WORDS",
    "FLOAT16",
    "FLOAT16_MULTIPLE",
    "FLOOR_MULTIPLE",
    "FUSED_CANNOT_RUN",
    "HISTOGRAM_EDGES",
    "INVALID_GRAPH",
    "MIN_COPY_BYTES",
    "MISMATCH",
    "ORIGINAL_CANNOT_RUN",
    "PERTURBATION",
    "CheckResult",
    "ErrorStats",
    "ExactCheck",
    "ExactOutput",
    "FloatDistribution",
    "InputSpec",
    "ModelFile",
    "NoiseFloor",
    "OutputFloor",
    "OutputCheck",
    "OutputSignature",
    "PrecisionReport",
    "ProfileCheck",
    "RegionReport",
    "Tolerance",
    "activation_quantizers",
    "candidate_dims",
    "evaluate_dim",
    "cycle_members",
    "describe_failure",
    "emitted_problems",
    "check_feeds",
    "check_fp16",
    "checker_problems",
    "compare_models",
    "compare_regions",
    "default_tolerance",
    "describe_inputs",
    "float16_parts",
    "fused_regions",
    "in_float32",
    "input_dims",
    "load_inputs",
    "make_session",
    "output_signature",
    "random_inputs",
    "session_file",
    "structure_problems",
    "tensor_diffs",
]
