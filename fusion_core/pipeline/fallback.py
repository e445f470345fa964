"""A failed check falls back: the largest set of fusions that passes, not nothing.

A CI pipeline that calls ``optimize`` should not lose its model to one wrong fusion. When
the check fails because of the fusion (the outputs differ, the fused graph is invalid or
does not run), ``fall_back`` runs progressive validation (``progressive.py``): fusions in
checked stages, each failing one found (``culprits.py``: the fusion whose node onnxruntime
refused to run, else by bisection) and dropped alone. What comes out is
checked against the original; when even that fails (a pre-pass changed what the model
computes), the model comes back as it was given. ``Result.fallback`` says what happened:
why the check failed, how many fusions were kept and which were dropped, and why.

Bisection re-runs the fusion pass and its check many times, and on a big model each is
seconds to minutes: the fallback's runs are bounded by a ``Budget`` of
``FALLBACK_RUNS`` times the failed run's own duration (at least ``FALLBACK_MIN_SECONDS``).
When it is spent, each stage keeps the largest set of fusions a run verified (or its
input), the rest is not tried, and ``Result.fallback["budget"]`` says so.

A check that could not run (the original itself does not run on the inputs) says
nothing about the fusions: no fallback. ``OptimizeConfig.strict`` turns the fallback off,
for pipelines that want the failure itself.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import onnx
import onnx_ir as ir

from autofusion.fusion_core.catalog import CompiledPattern
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.pipeline.once import unchanged
from autofusion.fusion_core.pipeline.progressive import Budget, progressive_as_configured
from autofusion.fusion_core.pipeline.result import Result
from autofusion.fusion_core.rewriters import RewriterRegistry
from autofusion.fusion_core.validate import ORIGINAL_CANNOT_RUN, describe_failure

__all__ = ["FALLBACK_MIN_SECONDS", "FALLBACK_RUNS", "fall_back", "fallback_budget", "falls_back"]

# The fallback may spend this many times the failed run (fusion pass and check): about
# one bisection of 2^8 fusions, or a few culprits in fewer
FALLBACK_RUNS = 8
# ... and at least this long: a small model's whole bisection, which costs little anyway
FALLBACK_MIN_SECONDS = 10.0


def falls_back(result: Result, config: OptimizeConfig) -> bool:
    """Whether ``result``'s check failed in a way a smaller set of fusions can fix."""
    check = result.check
    if config.strict or check is None or check.passed:
        return False
    return check.failure != ORIGINAL_CANNOT_RUN


def fall_back(
    model: ir.Model | onnx.ModelProto | str | os.PathLike,
    config: OptimizeConfig,
    failed: Result,
    *,
    registry: RewriterRegistry | None = None,
    patterns: Sequence[CompiledPattern] | None = None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    on_phase: Callable[[str], None] | None = None,
    budget_seconds: float | None = None,
) -> Result:
    """The largest verified subset of the fusions ``failed`` tried (or the model as it
    came), with ``Result.fallback`` saying what was dropped and why. ``budget_seconds``
    bounds the re-runs (default: ``fallback_budget(failed)``)."""
    if on_phase:
        on_phase("fallback")
    check = failed.check
    assert check is not None
    why = {
        "failure": check.failure,
        "reason": describe_failure(check),
        "fusions_tried": len(failed.applied),
    }
    if config.mode != "progressive":  # progressive validation has bisected already
        plain = config.model_copy(update={"measure": False, "selection": config.proposer})
        seconds = fallback_budget(failed) if budget_seconds is None else budget_seconds
        budget = Budget(seconds)
        result = progressive_as_configured(
            model, plain, registry=registry, patterns=patterns, feeds=feeds, budget=budget
        )
        why["budget"] = budget.to_dict()
        if result.check is not None and result.check.passed:
            result.rejected = list(dict.fromkeys([*failed.rejected, *result.rejected]))
            result.fallback = why | {
                "kept": len(result.applied),
                "dropped": result.rollbacks,
                "unchanged": False,
            }
            return result
        why["reason"] += f"; with the fusions that passed alone: {describe_failure(result.check)}"
    result = unchanged(model, config, feeds)
    result.fallback = why | {"kept": 0, "dropped": failed.rollbacks, "unchanged": True}
    result.rejected = failed.rejected
    return result


def fallback_budget(failed: Result) -> float:
    """Seconds the fallback may spend: ``FALLBACK_RUNS`` x the failed run's phases
    (load to check), at least ``FALLBACK_MIN_SECONDS``."""
    return max(FALLBACK_MIN_SECONDS, FALLBACK_RUNS * sum(failed.timings.values()))
