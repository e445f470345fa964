"""Before the sandbox starts: a job whose memory cannot fit the limit is refused.

The sandbox's memory limit (``job_memory_limit_mb``, its address space) kills a run
that needs more, after minutes of work and with an attempt spent. So once the model and
its external data are fetched, their bytes and the job's config give the peak the run
is predicted to reach (``fusion_core.predict_memory``: fitted multiples of the model,
erring high), and a prediction over the limit by more than ``job_memory_prediction_margin``
fails the job at once as ``memory-predicted``, saying what would fit instead (no
profiling and one plain pass, the check kept when that fits, else off too) or that
nothing does. The job's fused model is saved as its model came (``worker/sandbox.py``):
with a data file when the job has data files (predicted so), else one file below 2 GB
(past 2 GB with its data file, as every model there).
``job_memory_prediction=false`` tries every job.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from autofusion.app.core.config import Settings
from autofusion.fusion_core import MemoryPrediction, OptimizeConfig, predict_memory
from autofusion.fusion_core.report import bytes_text
from autofusion.worker.attempts import UserError

__all__ = ["MEMORY_PROBLEM", "JobMemoryError", "check_memory", "inputs_bytes"]

MEMORY_PROBLEM = "memory-predicted"
_LIMIT_SETTING = "AUTOFUSION_JOB_MEMORY_LIMIT_MB"


class JobMemoryError(UserError):
    """The job's predicted memory cannot fit the sandbox's limit: fail it, with this
    message (what it needs, the limit, and what to change)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, MEMORY_PROBLEM)


def inputs_bytes(folder: Path) -> int:
    """The bytes of the model and its external data, as fetched into ``folder``."""
    return sum(p.stat().st_size for p in folder.iterdir() if p.is_file())


def check_memory(
    settings: Settings, config: dict[str, Any], inputs: Path, *, external_data: bool = False
) -> int | None:
    """The predicted peak of this job in bytes (None: prediction off); raises
    ``JobMemoryError`` when it passes the limit by more than the margin.
    ``external_data``: the job's weights are in data files (and its fused model's will be)."""
    if not settings.job_memory_prediction:
        return None
    parsed = OptimizeConfig.model_validate(config)
    model_bytes = inputs_bytes(inputs)
    predict = partial(predict_memory, model_bytes, external_data=external_data)
    predicted = predict(parsed)
    limit = settings.job_memory_limit_mb << 20
    if predicted.peak_bytes > limit * (1 + settings.job_memory_prediction_margin):
        raise JobMemoryError(_refusal(parsed, predict, predicted.peak_bytes, limit))
    return predicted.peak_bytes


def _refusal(
    config: OptimizeConfig,
    predict: Callable[[OptimizeConfig], MemoryPrediction],
    needs: int,
    limit: int,
) -> str:
    model_bytes = predict(config).model_bytes
    what = _what_runs(config)
    told = (
        f"this model ({bytes_text(model_bytes)} with its data) needs about {bytes_text(needs)} "
        f"to optimize with {what}; this server's limit is {bytes_text(limit)}"
    )
    operator = f"ask the operator to raise {_LIMIT_SETTING}"
    for lean in (_lean(config, keep_check=True), _lean(config)):  # the check kept if it fits
        lean_needs = predict(lean).peak_bytes
        if lean != config and lean_needs <= limit:
            lean_text = f"which needs about {bytes_text(lean_needs)}"
            return f"{told}: {_changes(config, lean)}, {lean_text}, or {operator}"
    return (
        f"{told}, and even with the check off it needs about {bytes_text(lean_needs)}: "
        f"{operator}, or send the model to a server with more memory"
    )


def _what_runs(config: OptimizeConfig) -> str:
    parts = ["the check on" if config.check.enabled else "the check off"]
    if config.profile:
        parts.append("profiling")
    if config.mode != "plain":
        parts.append("measured selection" if config.mode == "measured" else "progressive stages")
    return " and ".join(parts)


def _lean(config: OptimizeConfig, *, keep_check: bool = False) -> OptimizeConfig:
    """The same job with profiling and the extra passes off, and the check unless
    ``keep_check``."""
    check = config.check.model_copy(update={"enabled": keep_check and config.check.enabled})
    update = {"check": check, "profile": False, "measure": False, "progressive": False}
    if config.selection == "measured":
        update["selection"] = "priority"
    return config.model_copy(update=update)


def _changes(config: OptimizeConfig, lean: OptimizeConfig) -> str:
    """What ``lean`` turns off of ``config``, in the config's words."""
    changes = []
    if config.check.enabled and not lean.check.enabled:
        changes.append("turn the check off (check.enabled=false)")
    if config.profile:
        changes.append("leave profiling off (profile=false)")
    if config.mode == "measured":
        changes.append("select without measuring (measure=false, selection other than measured)")
    elif config.mode == "progressive":
        changes.append("validate in one pass (progressive=false)")
    return ", ".join(changes)
