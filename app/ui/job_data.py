"""What the job pages read besides the row: the report and its region data, from the store.

The API process never loads a model: the region pictures are drawn from
``regions.json``, the nodes of each fused region that the sandbox wrote
(``fusion_core.report.region_pictures``), read as untrusted data.

Blobs are content-addressed, so what is derived from one (a report's speed, read by
``fusion_core.report.read_report``) is cached by digest and never goes stale.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from autofusion.app.core.errors import PROBLEM_BASE
from autofusion.app.core.models import Job, JobStatus
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.jobs import JOB_PROBLEMS
from autofusion.app.ui.report_view import DASH, report_view, speed_class
from autofusion.fusion_core.report import Speed, read_report, regions_from_data

__all__ = ["LIVE", "job_problem", "job_row", "load_report_view", "speed_of"]

logger = logging.getLogger(__name__)

LIVE = frozenset({JobStatus.queued.value, JobStatus.running.value})
REGIONS_ARTIFACT = "regions.json"
MAX_REGIONS_BYTES = 4 * 1024 * 1024  # what the sandbox writes is far smaller
_SPEEDS: dict[str, Speed | None] = {}
_MAX_CACHED = 4096


def speed_of(job: Job, store: ArtifactStore) -> Speed | None:
    """The measured speed from the job's report; None when it was not profiled."""
    digest = job.report_digest
    if not digest or job.status != JobStatus.succeeded.value:
        return None
    if digest not in _SPEEDS:
        try:
            report = json.loads(store.read_bytes(digest))
            speed = read_report(report).speed if isinstance(report, dict) else None
        # Any store's error (S3's is not an OSError): retention may have removed the
        # job and its report since the list was read; the row shows without a speed.
        except Exception as exc:
            logger.warning("job %s: cannot read its report: %s", job.id, exc)
            return None
        if len(_SPEEDS) >= _MAX_CACHED:
            _SPEEDS.clear()
        _SPEEDS[digest] = speed
    return _SPEEDS[digest]


def _created(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def job_row(job: Job, store: ArtifactStore) -> dict[str, Any]:
    """One line of the jobs table."""
    summary = job.summary or {}
    check = summary.get("check")
    verdict = DASH
    if isinstance(check, dict) and check.get("passed") is not None:
        verdict = "passed" if check["passed"] else "failed"
    speed = speed_of(job, store)
    return {
        "id": job.id,
        "status": job.status,
        "model_name": job.model_name,
        "target": summary.get("target") or (job.config or {}).get("target") or DASH,
        "ratio": f"{speed.ratio:.3f}" if speed else None,
        "speedup": f"{speed.speedup:.2f}×" if speed else DASH,
        "speed_verdict": (speed.verdict or "") if speed else "",
        "speed_class": speed_class(speed),
        "speed_line": speed.describe() if speed else "",
        "verdict": verdict,
        "created": _created(job.created_at),
        "live": job.status in LIVE,
    }


def _regions(job: Job, store: ArtifactStore) -> list[dict[str, Any]] | None:
    digest = ((job.summary or {}).get("artifacts") or {}).get(REGIONS_ARTIFACT)
    if not digest:
        return None
    data = store.read_bytes(digest)
    if len(data) > MAX_REGIONS_BYTES:
        return None
    return regions_from_data(json.loads(data))


def load_report_view(job: Job, store: ArtifactStore) -> dict[str, Any] | None:
    """The report as the page shows it, with region pictures when the models allow."""
    if not job.report_digest:
        return None
    report = json.loads(store.read_bytes(job.report_digest))
    regions = None
    if job.status == JobStatus.succeeded.value and report.get("applied"):
        try:
            regions = _regions(job, store)
        except Exception as exc:  # a picture is not worth failing the page for
            logger.warning("job %s: no region pictures: %s", job.id, exc)
    view = report_view(report, regions=regions)
    view["model"] = report.get("model")
    return view


def job_problem(job: Job) -> dict[str, str | None] | None:
    """Why a failed job failed (or a live one's last error) as a problem: ``type`` (a
    URL), ``slug``, ``title`` and ``detail``. The row keeps the slug (``error_type``)
    and the detail (``error``); an ``error`` stored as a problem object is read as one."""
    error = job.error
    if not (job.status == JobStatus.failed.value or (error and job.status != "succeeded")):
        return None
    if isinstance(error, dict):
        type_ = str(error.get("type") or "") or None
        slug = (
            type_.removeprefix(PROBLEM_BASE) if type_ and type_.startswith(PROBLEM_BASE) else None
        )
        title, detail = error.get("title"), error.get("detail")
    else:
        slug = job.error_type if job.status == JobStatus.failed.value else None
        type_ = f"{PROBLEM_BASE}{slug}" if slug else None
        title, detail = JOB_PROBLEMS.get(slug or ""), error
    return {
        "type": type_,
        "slug": slug,
        "title": str(title) if title else None,
        "detail": str(detail) if detail else "the job failed without a message",
    }
