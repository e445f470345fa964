"""A job's files: the fused model, report.json and the renderings stored beside it.

The API (``/v1/jobs/{id}/...``, keys in headers) and the dashboard (``/ui/jobs/{id}/
download/...``, the key in a cookie) serve the same files through these functions.

The store is content-addressed, so a file's sha256 is known without reading it: it is
the file's strong ``ETag`` (the same on every download, and from every server of a
cluster) and its RFC 9530 ``Repr-Digest``.
"""

from __future__ import annotations

import base64
import tempfile
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import format_datetime
from pathlib import Path

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import Job, JobStatus
from autofusion.app.services.artifacts import ArtifactStore, download_headers

__all__ = [
    "ARTIFACT_CSP",
    "ARTIFACT_TYPES",
    "REPORT_PAGE_CSP",
    "JobFile",
    "artifact_digest",
    "artifact_file",
    "check_artifact_name",
    "fused_data_file",
    "fused_model_file",
    "fused_model_filename",
    "not_available",
    "original_model_file",
    "report_file",
    "report_page_file",
    "temporary_copy",
]

# The files the worker stores beside report.json (worker/sandbox.py), by name.
ARTIFACT_TYPES = {
    "report.html": "text/html; charset=utf-8",
    "report.md": "text/markdown; charset=utf-8",
    "profile_trace.json": "application/json",
    "regions.json": "application/json",  # the fused regions' nodes, for the dashboard
    # the regions of steps taken back as bugs, one ONNX file each, for a bug report
    "reproducers.zip": "application/zip",
}
# report.html is self-contained: no scripts, its styles inline.
ARTIFACT_CSP = "default-src 'none'; style-src 'unsafe-inline'"
# The report page, opened in the browser (inline): its charts are inline SVG (data:
# images at most), and ``sandbox`` gives it an opaque origin with scripts off, so even a
# hostile report.html can neither run script nor read the dashboard's cookies.
REPORT_PAGE_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; sandbox"


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


def _stem(job: Job) -> str:
    return fused_model_filename(job).removesuffix(".fused.onnx")


@dataclass(frozen=True)
class JobFile:
    """One stored file of a job as a download: where it is and what to say about it."""

    digest: str  # sha256, hex: the blob's address in the store
    media_type: str
    filename: str  # the name the download suggests (the user's model name in it)
    modified: datetime  # when the job finished (its files were written then)
    csp: str | None = None  # a Content-Security-Policy of its own (the renderings)
    stream: bool = False  # sent from a temporary copy, never held in memory (the model)
    inline: bool = False  # shown in the browser, not saved (the report page only)

    @property
    def etag(self) -> str:
        """Strong: the bytes are the digest's, whoever serves them and however often."""
        return f'"{self.digest}"'

    @property
    def repr_digest(self) -> str:
        """RFC 9530 ``Repr-Digest``: the sha256, base64 as a structured-field byte sequence."""
        return f"sha-256=:{base64.b64encode(bytes.fromhex(self.digest)).decode()}:"

    def headers(self) -> dict[str, str]:
        """The headers of a download of this file (a GET, a HEAD, a 304 takes some)."""
        headers = {
            **download_headers(self.filename, "inline" if self.inline else "attachment"),
            "ETag": self.etag,
            "Repr-Digest": self.repr_digest,
            "Last-Modified": format_datetime(self.modified.astimezone(UTC), usegmt=True),
            # Revalidate each time: a 304 is cheap, and the key is checked again.
            "Cache-Control": "private, no-cache",
        }
        if self.csp:
            headers["Content-Security-Policy"] = self.csp
        return headers


def _finished(job: Job) -> datetime:
    finished = job.finished_at or job.created_at  # a finished job always has finished_at
    # SQLite hands back naive datetimes; every timestamp we store is UTC.
    return finished if finished.tzinfo is not None else finished.replace(tzinfo=UTC)


def fused_model_file(job: Job) -> JobFile:
    """The fused model, once the job has succeeded (409 before)."""
    if job.status != JobStatus.succeeded or not job.fused_digest:
        raise not_available(job.id, job.status, "the fused model exists once it has succeeded")
    return JobFile(
        job.fused_digest,
        "application/octet-stream",
        fused_model_filename(job),
        _finished(job),
        stream=True,
    )


def fused_data_file(job: Job, name: str) -> JobFile:
    """One of the fused model's data files (409 before it has succeeded, 404 for a name
    it does not have)."""
    model = fused_model_file(job)
    entries = {e["name"]: e["digest"] for e in (job.summary or {}).get("fused_data_files") or []}
    if name not in entries:
        have = ", ".join(sorted(entries)) or "none: its weights are inside the model file"
        raise ProblemError(
            404,
            "not-found",
            "Not found",
            f"the fused model of job {job.id} has no data file {name!r} (its data files: "
            f"{have}); the job's links.model_data lists them",
        )
    return JobFile(entries[name], model.media_type, name, model.modified, stream=True)


def original_model_file(job: Job) -> JobFile:
    """The model as uploaded (its external data files not included): the dashboard
    offers it beside the fused model, for a graph viewer."""
    created = job.created_at if job.created_at.tzinfo else job.created_at.replace(tzinfo=UTC)
    name = Path(job.model_name).name or "model.onnx"
    return JobFile(job.model_digest, "application/octet-stream", name, created, stream=True)


def report_file(job: Job) -> JobFile:
    """report.json, once the job has finished with one (409 before)."""
    if not JobStatus(job.status).is_final or not job.report_digest:
        raise not_available(job.id, job.status, "the report exists once it has finished")
    return JobFile(
        job.report_digest, "application/json", f"{_stem(job)}.report.json", _finished(job)
    )


def artifact_file(job: Job, name: str) -> JobFile:
    """One of ``ARTIFACT_TYPES`` (404 for another name), once the job has it (409 before)."""
    check_artifact_name(name)
    digest = artifact_digest(job, name)
    if not JobStatus(job.status).is_final or not digest:
        raise not_available(job.id, job.status, f"{name} exists once it has succeeded")
    return JobFile(
        digest, ARTIFACT_TYPES[name], f"{_stem(job)}.{name}", _finished(job), csp=ARTIFACT_CSP
    )


def report_page_file(job: Job) -> JobFile:
    """report.html to open in the browser: ``inline``, under ``REPORT_PAGE_CSP``."""
    file = artifact_file(job, "report.html")
    return replace(file, csp=REPORT_PAGE_CSP, inline=True)


def temporary_copy(file: JobFile, store: ArtifactStore, folder: Path) -> Path:
    """A temporary copy of ``file`` under ``folder`` (the caller removes it), so a
    response streams it without holding it in memory, whichever store holds it (a hard
    link to the blob where the store is a folder on the same file system)."""
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, delete=False) as tmp:
        path = Path(tmp.name)
    try:
        store.fetch_for_reading(file.digest, path)
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    return path


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
