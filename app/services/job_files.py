"""A job's files: the fused model, report.json and the renderings stored beside it.

The API (``/v1/jobs/{id}/...``, keys in headers) and the dashboard (``/ui/jobs/{id}/
download/...``, the key in a cookie) serve the same files through these functions.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from app.core.errors import ProblemError
from app.core.models import Job, JobStatus
from app.services.artifacts import ArtifactStore

__all__ = [
    "ARTIFACT_CSP",
    "ARTIFACT_TYPES",
    "artifact_bytes",
    "artifact_digest",
    "check_artifact_name",
    "fused_model_copy",
    "fused_model_filename",
    "not_available",
    "report_bytes",
]

# The files the worker stores beside report.json (worker/sandbox.py), by name.
ARTIFACT_TYPES = {
    "report.html": "text/html; charset=utf-8",
    "report.md": "text/markdown; charset=utf-8",
    "profile_trace.json": "application/json",
    "regions.json": "application/json",  # the fused regions' nodes, for the dashboard
}
# report.html is self-contained: no scripts, its styles inline.
ARTIFACT_CSP = "default-src 'none'; style-src 'unsafe-inline'"


def not_available(job_id: str, status: str, what: str) -> ProblemError:
    return ProblemError(
        409,
        "job-not-succeeded",
        "Job has no result",
        f"job {job_id} is {status}: {what}; follow /v1/jobs/{job_id}/events or poll "
        f"/v1/jobs/{job_id}",
        job_status=status,
    )


def fused_model_filename(job: Job) -> str:
    return f"{Path(job.model_name).stem}.fused.onnx"


def fused_model_copy(job: Job, store: ArtifactStore, folder: Path) -> Path:
    """A temporary copy of the fused model under ``folder`` (the caller removes it), so
    a response streams it without holding it in memory, whichever store holds it."""
    if job.status != JobStatus.succeeded or not job.fused_digest:
        raise not_available(job.id, job.status, "the fused model exists once it has succeeded")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, delete=False) as tmp:
        path = Path(tmp.name)
    try:
        store.fetch(job.fused_digest, path)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


def report_bytes(job: Job, store: ArtifactStore) -> bytes:
    """report.json, once the job has finished with one."""
    if not JobStatus(job.status).is_final or not job.report_digest:
        raise not_available(job.id, job.status, "the report exists once it has finished")
    return store.read_bytes(job.report_digest)


def artifact_digest(job: Job, name: str) -> str | None:
    """The digest of the job's stored ``name`` (None: the job has none)."""
    return ((job.summary or {}).get("artifacts") or {}).get(name)


def check_artifact_name(name: str) -> str:
    if name not in ARTIFACT_TYPES:
        raise ProblemError(
            404,
            "artifact-not-found",
            "No such artifact",
            f"jobs have no artifact {name!r}; the artifacts are {sorted(ARTIFACT_TYPES)}",
        )
    return name


def artifact_bytes(job: Job, name: str, store: ArtifactStore) -> bytes:
    """One of ``ARTIFACT_TYPES``, once the job has finished with it."""
    check_artifact_name(name)
    digest = artifact_digest(job, name)
    if not JobStatus(job.status).is_final or not digest:
        raise not_available(job.id, job.status, f"{name} exists once it has succeeded")
    return store.read_bytes(digest)
