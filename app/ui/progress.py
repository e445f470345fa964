"""The job page's progress: the phase in words, the time it has taken, and an estimate of
the time left.

The estimate comes from the tenant's earlier jobs of the same kind (profiled or not,
measured selection or not): the median time of each phase over them, scaled by how
this job's finished phases compared with theirs (a model twice as slow to optimize is
likely twice as slow to profile). Before any phase that took a second elsewhere has
finished here, the medians are taken as they are. With no earlier job there is no
estimate, and the page says so.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from markupsafe import Markup
from pydantic import ValidationError

from autofusion.app.core.models import Job, JobStatus
from autofusion.app.services.job_phases import PastJob, Span, phase_spans
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.report import timeline

__all__ = [
    "STAGE_LABELS",
    "Estimate",
    "estimate_remaining",
    "fmt_seconds",
    "history_for",
    "job_kind",
    "progress_view",
]

# What each stage the worker reports means (worker/execute.py, worker/sandbox.py,
# fusion_core.pipeline.run).
STAGE_LABELS = {
    "queued": "waiting for a worker",
    "starting": "starting: the worker took the job",
    "fetching": "fetching the model from the store",
    "prepasses": "loading the model and running the pre-passes (constant folding, shapes)",
    "fusing": "matching the patterns and rewriting",
    "checking": "the numerical check: both models run in onnxruntime",
    "measuring": "measured selection: timing groups of fusions",
    "progressive": "progressive validation: fusing and checking stage by stage",
    "falling_back": "the check failed: finding the largest set of fusions that passes",
    "saving": "saving the fused model",
    "profiling": "timing both models in onnxruntime",
    "report": "writing the report and its pictures",
    "storing": "storing the fused model and the report",
}
SCALE_BASIS_S = 1.0  # finished phases worth less than this elsewhere: medians as they are
_SCALE_LIMITS = (0.05, 100.0)
HISTORY_TTL_S = 15.0  # the live section polls every second: earlier jobs change rarely
_HISTORY: dict[tuple[str, str, tuple[bool, bool]], tuple[float, list[PastJob]]] = {}
_MAX_CACHED = 256


@dataclass(frozen=True)
class Estimate:
    """Seconds left; ``jobs``: earlier jobs it comes from; ``scaled``: by this job's
    finished phases; ``overdue``: the current phase runs longer than expected."""

    seconds: float
    jobs: int
    scaled: bool
    overdue: bool


def job_kind(config: Any) -> tuple[bool, bool]:
    """What changes a job's phases most: profiled, and measured selection."""
    config = config if isinstance(config, dict) else {}
    try:  # the config decides the mode, here as in the pipeline (OptimizeConfig.mode)
        measured = OptimizeConfig.model_validate(config).mode == "measured"
    except (ValidationError, ConfigError):  # a row written by an older release
        measured = False
    return bool(config.get("profile")), measured


def history_for(job: Job, load, database: str) -> list[PastJob]:
    """Earlier jobs of ``job``'s tenant and kind, from ``load(tenant_id)`` (a query on
    ``database``), cached for ``HISTORY_TTL_S`` once there are any."""
    kind = job_kind(job.config)
    key = (database, job.tenant_id, kind)
    cached = _HISTORY.get(key)
    if cached is None or cached[0] < time.monotonic():
        if len(_HISTORY) >= _MAX_CACHED:
            _HISTORY.clear()
        past = [p for p in load(job.tenant_id) if job_kind(p.config) == kind]
        cached = (time.monotonic() + HISTORY_TTL_S, past)
        if past:  # none yet: ask again at the next poll, a job may just have finished
            _HISTORY[key] = cached
    return cached[1]


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every timestamp stored is UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _durations(past: list[PastJob]) -> dict[str, float]:
    seen: dict[str, list[float]] = {}
    for job in past:
        per_stage: dict[str, float] = {}
        for span in job.spans:  # all ended: the job finished
            per_stage[span.stage] = per_stage.get(span.stage, 0.0) + span.seconds(span.start)
        for stage, seconds in per_stage.items():
            seen.setdefault(stage, []).append(seconds)
    return {stage: statistics.median(values) for stage, values in seen.items()}


def estimate_remaining(spans: list[Span], now: datetime, past: list[PastJob]) -> Estimate | None:
    """Seconds until the job is done, or None when nothing is known to go by."""
    if not spans or not past:
        return None
    medians = _durations(past)
    current = spans[-1]
    sequence = [s.stage for s in past[0].spans]
    if current.stage not in sequence or current.stage not in medians:
        return None
    after = sequence[sequence.index(current.stage) + 1 :]
    basis = sum(medians.get(s.stage, 0.0) for s in spans[:-1])
    took = sum(s.seconds(now) for s in spans[:-1])
    scaled = basis >= SCALE_BASIS_S
    scale = min(max(took / basis, _SCALE_LIMITS[0]), _SCALE_LIMITS[1]) if scaled else 1.0
    expected_now = scale * medians[current.stage]
    in_current = current.seconds(now)
    rest = sum(scale * medians.get(stage, 0.0) for stage in after)
    return Estimate(
        seconds=max(expected_now - in_current, 0.0) + rest,
        jobs=len(past),
        scaled=scaled,
        overdue=in_current > expected_now,
    )


def fmt_seconds(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``3 min 05 s``, ``1 h 02 min``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _label(stage: str) -> str:
    return STAGE_LABELS.get(stage, stage)


def _timeline(job: Job, spans: list[Span], now: datetime) -> Markup | None:
    if not spans:
        return None
    segments = [(span.stage, span.seconds(now)) for span in spans]
    svg = timeline(f"timeline-{job.id}", "time per phase", segments)
    return Markup(svg)  # timeline escapes every label


def progress_view(job: Job, now: datetime, past: list[PastJob] | None) -> dict[str, Any]:
    """The phase, its description, the elapsed times, the estimate and the phases."""
    spans = phase_spans(job.phases, job.started_at, job.finished_at)
    view: dict[str, Any] = {
        "stage_label": _label(job.stage),
        "phases": [
            {"stage": s.stage, "label": _label(s.stage), "seconds": fmt_seconds(s.seconds(now))}
            for s in spans
        ],
        "timeline": _timeline(job, spans, now),
        "elapsed": None,
        "in_phase": None,
        "waiting": None,
        "remaining": None,
        "estimate_note": None,
        "took": None,
    }
    if job.status == JobStatus.queued.value:
        view["waiting"] = fmt_seconds(max((now - _utc(job.created_at)).total_seconds(), 0.0))
        return view
    start, end = _utc(job.started_at), _utc(job.finished_at)
    if start is None:
        return view
    if end is not None:
        view["took"] = fmt_seconds(max((end - start).total_seconds(), 0.0))
        return view
    view["elapsed"] = fmt_seconds(max((now - start).total_seconds(), 0.0))
    if spans:
        view["in_phase"] = fmt_seconds(spans[-1].seconds(now))
    _add_estimate(view, spans, now, past)
    return view


def _add_estimate(
    view: dict[str, Any], spans: list[Span], now: datetime, past: list[PastJob] | None
) -> None:
    estimate = estimate_remaining(spans, now, past or [])
    if estimate is None:
        view["estimate_note"] = (
            "no estimate yet: no earlier job of this kind finished with its phases recorded"
            if not past
            else "no estimate: earlier jobs of this kind did not go through this phase"
        )
        return
    view["remaining"] = fmt_seconds(estimate.seconds)
    how = "scaled by this job's finished phases" if estimate.scaled else "their medians"
    note = f"from {estimate.jobs} earlier job(s) of this kind, {how}"
    if estimate.overdue:
        note += "; this phase is taking longer than expected"
    view["estimate_note"] = note
