"""The check of a fused model against its original: outputs, structure, regions, fp16.

onnxruntime runs both on the same inputs (``fusion_core.validate.compare_models``);
the generic target must also pass onnx's checker. When the outputs differ, the fused
region that drifts first is named; with precision fp16 the range analysis of every fused
region is added.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.ir import PROTOBUF_LIMIT_BYTES
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.validate import (
    CANNOT_LOAD,
    INVALID_GRAPH,
    ORIGINAL_CANNOT_RUN,
    FloatDistribution,
    check_fp16,
    checker_problems,
    compare_models,
    compare_regions,
    random_inputs,
)

__all__ = ["check_against_original"]


def check_against_original(
    result: Result,
    original: onnx.ModelProto,
    config: OptimizeConfig,
    keep_fp32: set[str],
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
) -> None:
    """Compare with the original; on failure name the drifting region; fp16 ranges."""
    c = config.check
    fused = result.to_proto()
    distribution = FloatDistribution(
        c.input_distribution, mean=c.input_mean, std=c.input_std, low=c.input_low, high=c.input_high
    )
    result.check = compare_models(
        original,
        fused,
        rtol=c.rtol,
        atol=c.atol,
        samples=c.samples,
        seed=c.seed,
        profiles=c.shape_profiles(),
        tolerances=c.tolerances,
        distribution=distribution,
        feeds=feeds,
    )
    # onnxruntime's own registrations (LayerNormalization below opset 17) fail onnx's
    # checker by design; the generic target must pass it in full.
    if config.target == "generic" and fused.ByteSize() <= PROTOBUF_LIMIT_BYTES:
        result.structure += _new_checker_problems(original, fused)
    if result.structure:  # an invalid graph, whatever the outputs say
        result.check.passed = False
        result.check.failure = INVALID_GRAPH
        result.check.error = "; ".join(result.structure)
    if result.check.failure in (ORIGINAL_CANNOT_RUN, CANNOT_LOAD):
        return  # nothing ran: no region or range can be compared either
    if feeds is None and (not result.check.passed or config.precision == "fp16"):
        # the sizes the check settled on: ones the original runs on
        dims = result.check.profiles[0].dims if result.check.profiles else c.shape_profiles()[0]
        feeds = [
            random_inputs(original, seed=c.seed + k, dims=dims, distribution=distribution)
            for k in range(c.samples)
        ]
    if feeds and result.applied and not result.check.passed:
        result.regions = compare_regions(original, fused, feeds, rtol=c.rtol, atol=c.atol)
    if feeds and result.applied and config.precision == "fp16":
        result.precision = check_fp16(original, fused, feeds, keep_fp32=keep_fp32)


def _new_checker_problems(original: onnx.ModelProto, fused: onnx.ModelProto) -> list[str]:
    """onnx's checker on the fused model, at the strictest level the original passes:
    what the model already had (onnx's node test ``test_mvn`` fails the full check as
    shipped) is not the fusion's doing."""
    for full_check in (True, False):
        if not checker_problems(original, full_check=full_check):
            return checker_problems(fused, full_check=full_check)
    return []
