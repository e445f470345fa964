"""Real reports for the consumers' tests (CI client, dashboard, job summary).

Every report here is ``fusion_core.report.build_report`` output for a real optimization
of a small Conv+BN+Relu model, profiled by ``fusion_core.profiling.profile_models`` when
asked: no key is written by hand, so a renamed report key fails these tests.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import onnx
from ui_testing import conv_bn_relu

from autofusion.fusion_core import OptimizeConfig, optimize, save_model
from autofusion.fusion_core.profiling import PairedRatio, ProfileOptions, profile_models
from autofusion.fusion_core.report import DEPLOYMENT_LEVEL, build_report

# Quick but real: enough paired runs for a 95% interval.
QUICK_PROFILE = ProfileOptions(warmup=1, iters=12, node_runs=1)


def write_model(folder: Path, name: str = "net.onnx", width: int = 16) -> Path:
    path = folder / name
    onnx.save_model(conv_bn_relu(width=width), path)
    return path


def real_report(
    folder: Path,
    *,
    profile: bool = False,
    paired: PairedRatio | None = None,
    **config: Any,
) -> dict[str, Any]:
    """``build_report`` of optimizing the test model with ``config``; ``profile`` measures
    both models. ``paired`` replaces the measured paired ratio at the deployment level
    (a verdict chosen by the test, in the profile's own record type)."""
    folder.mkdir(parents=True, exist_ok=True)
    model = write_model(folder)
    options = OptimizeConfig.model_validate({**config, "profile": profile or paired is not None})
    result = optimize(model, options)
    fused = folder / "net.fused.onnx"
    save_model(result.model, fused)
    measured = None
    if profile or paired is not None:
        profiled = profile_models(model, fused, options=QUICK_PROFILE)
        if paired is not None:
            profiled.latency = [
                replace(c, paired=paired) if c.level == DEPLOYMENT_LEVEL else c
                for c in profiled.latency
            ]
        measured = profiled.to_dict()
    report = build_report(
        result,
        model=model.name,
        output=fused.name,
        model_file=model,
        output_file=fused,
        config=options,
        profile=measured,
    )
    return json.loads(json.dumps(report))  # as a consumer receives it


def paired(verdict: str) -> PairedRatio:
    """A paired ratio with the verdict asked for (20 runs, ~96% interval)."""
    median, low, high = {
        "faster": (0.8, 0.78, 0.83),
        "no measurable change": (0.99, 0.96, 1.03),
        "slower": (1.25, 1.2, 1.31),
    }[verdict]
    return PairedRatio(
        median=median, low=low, high=high, confidence=0.9586, runs=20, verdict=verdict
    )
