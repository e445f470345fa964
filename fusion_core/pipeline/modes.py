"""``optimize``: one pass, progressive stages, or measured selection, as the config says.

The three modes build on ``optimize_once`` (``once.py``); this module only chooses, so
that progressive validation and measured selection can call the one pass without
calling back into the choice (no import circle).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.catalog import CompiledPattern
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.pipeline.fallback import fall_back, falls_back
from autofusion.fusion_core.pipeline.measured import optimize_measured
from autofusion.fusion_core.pipeline.once import optimize_once
from autofusion.fusion_core.pipeline.progressive import progressive_as_configured
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.pipeline.size_cap import check_output_size
from autofusion.fusion_core.rewriters import RewriterRegistry

__all__ = ["optimize"]


def optimize(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
    config: OptimizeConfig | None = None,
    *,
    registry: RewriterRegistry | None = None,
    patterns: Sequence[CompiledPattern] | None = None,
    skip: Mapping[tuple[str, frozenset[str]], str] | None = None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    on_phase: Callable[[str], None] | None = None,
) -> Result:
    """Fuse ``model`` for ``config.target`` and (unless disabled) check the result.

    ``patterns`` replaces the built-in patterns (the service passes its registry
    snapshot); ``registry`` adds rewriters beyond the built-in ones. ``skip`` names
    fusions not to apply, as (pattern, matched node names) -> reason (progressive
    validation rolls back a fusion this way); they are reported as near misses.
    When the check fails, the run falls back to the largest set of fusions that passes
    (``fallback.py``; ``Result.fallback`` says what was dropped) unless ``config.strict``;
    then ``Result.regions`` names the fused region that drifts first.
    A fused model holding more constants than ``config.output_size_ratio`` x the
    input's + ``config.output_size_floor_bytes`` raises UnsafeModelError (``size_cap.py``).
    ``feeds`` (the user's inputs, ``fusion_core.validate.load_inputs``) replace the
    generated check samples. ``on_phase`` hears each phase by name as it starts (``load``,
    ``prepasses``, ``fuse``, ``check``; ``measure`` or ``progressive`` for those modes,
    which run many passes), for a caller that shows progress.
    """
    config = config or OptimizeConfig()
    result = _in_mode(model, config, registry, patterns, skip, feeds, on_phase)
    if falls_back(result, config):
        verdicts = result.verdicts  # timings stay true when the check fails: kept
        result = fall_back(
            model, config, result, registry=registry, patterns=patterns, feeds=feeds,
            on_phase=on_phase,
        )  # fmt: skip
        result.verdicts = verdicts
    # Each pass checked its own input; progressive stages start from the previous
    # stage's model, so the whole run is checked against the model as given too.
    check_output_size(result, config)
    return result


def _in_mode(model, config, registry, patterns, skip, feeds, on_phase) -> Result:
    mode = config.mode
    if mode == "measured":
        if on_phase:
            on_phase("measure")
        return optimize_measured(model, config, registry=registry, patterns=patterns, feeds=feeds)
    if mode == "progressive":
        if on_phase:
            on_phase("progressive")
        return progressive_as_configured(
            model, config, registry=registry, patterns=patterns, feeds=feeds
        )
    return optimize_once(
        model, config, registry=registry, patterns=patterns, skip=skip, feeds=feeds,
        on_phase=on_phase,
    )  # fmt: skip
