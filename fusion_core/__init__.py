"""autofusion's core: a pure library that fuses operators in ONNX models.

from autofusion.fusion_core import optimize, OptimizeConfig
result = optimize("model.onnx", OptimizeConfig(target="onnxruntime"))
save_model(result.model, "fused.onnx")

The names below load on first use (``lazy_loader``, SPEC 1): ``import fusion_core.errors``
or ``fusion_core.targets`` costs no onnx or onnxruntime import, so the CLI's ``--help``
and its client commands start at once; ``fusion_core.optimize`` loads the engine.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "catalog": ["CompiledPattern", "builtin_patterns", "compile_pattern", "load_pattern_file"],
        "config": ["CheckOptions", "OptimizeConfig"],
        "errors": [
            "ConfigError",
            "FusionError",
            "ModelLoadError",
            "PatternError",
            "UnsafeModelError",
        ],
        "ir": ["load_model", "save_model"],
        "pipeline": ["AppliedFusion", "Result", "optimize"],
        "pipeline.files": ["RunFiles", "RunOutcome", "run"],
        "pipeline.memory": ["MemoryPrediction", "predict_memory", "predict_peak_bytes"],
        "targets": ["TARGETS"],
    },
)
