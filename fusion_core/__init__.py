"""autofusion's core: a pure library that fuses operators in ONNX models.

from fusion_core import optimize, OptimizeConfig
result = optimize("model.onnx", OptimizeConfig(target="onnxruntime"))
save_model(result.model, "fused.onnx")
"""

from fusion_core.catalog import (
    CompiledPattern,
    builtin_patterns,
    compile_pattern,
    load_pattern_file,
)
from fusion_core.config import CheckOptions, OptimizeConfig
from fusion_core.errors import (
    ConfigError,
    FusionError,
    ModelLoadError,
    PatternError,
    UnsafeModelError,
)
from fusion_core.ir import load_model, save_model
from fusion_core.pipeline import AppliedFusion, Result, optimize
from fusion_core.pipeline.files import RunFiles, RunOutcome, run
from fusion_core.targets import TARGETS

__all__ = [
    "TARGETS",
    "AppliedFusion",
    "CheckOptions",
    "CompiledPattern",
    "ConfigError",
    "FusionError",
    "ModelLoadError",
    "OptimizeConfig",
    "PatternError",
    "Result",
    "RunFiles",
    "RunOutcome",
    "UnsafeModelError",
    "builtin_patterns",
    "compile_pattern",
    "load_model",
    "load_pattern_file",
    "optimize",
    "run",
    "save_model",
]
