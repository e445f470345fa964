"""Per-tenant quotas (issue 26): queued jobs and stored bytes, checked when a job is
submitted; the running-jobs limit is the claim's (``app/services/job_claims.py``).

What is counted:

- *queued jobs*: the tenant's jobs whose status is ``queued``.
- *stored bytes*: the sizes of the distinct blobs the tenant's jobs refer to
  (``JobArtifact``: models and data files as uploaded, fused models, reports and their
  renderings) and its complete data uploads refer to (``DataUpload.digest``), plus the
  declared size of each of its data uploads still receiving: the room it will take is
  reserved when it starts. A model uploaded twice is stored once, and counted once.
- *open uploads*: the tenant's data uploads still receiving (``check_new_upload``).

Where (``docs/service.md``, "Quotas and retention"):

- before the body streams (``check_before_upload``): a tenant at its queued limit, or
  whose stored bytes plus the request's ``Content-Length`` (less what the multipart
  framing may take) pass its limit, is refused without reading a byte of the body;
- when the job row is written (``check_new_job``), or a data upload's
  (``check_new_upload``), in the row's own transaction after the insert: the tenant's
  row is locked first, so on PostgreSQL two submits of one tenant take turns, and on
  SQLite the insert holds the database's write lock; either way two submits at once
  cannot both take the last place.

A refusal says what was counted, the limit and the setting, and what frees room.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import func, select, union_all
from sqlalchemy.orm import Session

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import (
    DataUpload,
    DataUploadStatus,
    Job,
    JobArtifact,
    JobStatus,
    Tenant,
    utcnow,
)
from autofusion.app.services.idempotency import keyed_job

__all__ = [
    "MULTIPART_SLACK_BYTES",
    "QUEUED_RETRY_AFTER_S",
    "Quotas",
    "check_before_upload",
    "check_new_job",
    "check_new_upload",
    "describe_bytes",
    "lock_tenant",
    "open_uploads",
    "queued_jobs",
    "record_artifacts",
    "stored_bytes",
]

# A queued job waits for a running one to end, which takes minutes: asking again every
# retry_after_s (2 s) would only load the server.
QUEUED_RETRY_AFTER_S = 30
# A body's Content-Length counts more than its files: the multipart framing, a header per
# data file (up to 1000) and the config part (up to 1 MiB). The early check allows this
# much beyond the files, so it never refuses what would fit; the check with the insert
# counts the files exactly.
MULTIPART_SLACK_BYTES = 2 * 1024**2
_FINAL = [status.value for status in JobStatus if status.is_final]


@dataclass(frozen=True)
class Quotas:
    """The limits of one tenant (0: none), and how retention frees room."""

    max_queued_jobs: int = 0
    max_stored_bytes: int = 0
    job_retention_s: float = 0.0
    sweep_interval_s: float = 300.0
    max_open_uploads: int = 0

    @classmethod
    def from_settings(cls, settings: Any) -> Quotas:
        """``settings``: app.core.config.Settings."""
        return cls(
            settings.max_queued_jobs_per_tenant,
            settings.max_stored_bytes_per_tenant,
            settings.job_retention_s,
            settings.scratch_sweep_interval_s,
            settings.max_open_uploads_per_tenant,
        )


def describe_bytes(value: int) -> str:
    """``value`` in the largest binary unit that keeps it at 1 or more (``1.5 GiB``)."""
    amount = float(value)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if amount < 1024 or unit == "GiB":
            return f"{int(amount)} bytes" if unit == "bytes" else f"{amount:.1f} {unit}"
        amount /= 1024
    raise AssertionError("unreachable")


def lock_tenant(session: Session, tenant_id: str) -> None:
    """Hold the tenant's row until the transaction ends (PostgreSQL; SQLite renders no
    lock: its writers take turns anyway). Take it before writing the tenant's jobs."""
    # FOR NO KEY UPDATE: it does not wait for (or block) the inserts of the tenant's
    # jobs, whose foreign key takes KEY SHARE on this row.
    locked = select(Tenant.id).where(Tenant.id == tenant_id).with_for_update(key_share=True)
    session.execute(locked)


def queued_jobs(session: Session, tenant_id: str) -> int:
    query = select(func.count()).where(
        Job.tenant_id == tenant_id, Job.status == JobStatus.queued.value
    )
    return int(session.scalar(query) or 0)


def stored_bytes(session: Session, tenant_id: str | None = None) -> int:
    """The bytes of the distinct blobs the tenant's jobs and complete data uploads refer
    to, plus the declared sizes of its data uploads still receiving (every tenant's:
    None). A size not known yet (a job from before sizes were recorded) counts 0 until
    the retention sweep fills it in."""
    of_jobs = select(JobArtifact.digest.label("digest"), JobArtifact.size.label("size"))
    of_uploads = select(DataUpload.digest.label("digest"), DataUpload.size.label("size"))
    of_uploads = of_uploads.where(DataUpload.digest.is_not(None))
    receiving = select(func.coalesce(func.sum(DataUpload.size), 0)).where(
        DataUpload.status == DataUploadStatus.receiving.value
    )
    if tenant_id is not None:
        of_jobs = of_jobs.join(Job, Job.id == JobArtifact.job_id).where(Job.tenant_id == tenant_id)
        of_uploads = of_uploads.where(DataUpload.tenant_id == tenant_id)
        receiving = receiving.where(DataUpload.tenant_id == tenant_id)
    blobs = union_all(of_jobs, of_uploads).subquery()
    per_blob = (
        select(blobs.c.digest, func.max(blobs.c.size).label("size"))
        .group_by(blobs.c.digest)
        .subquery()
    )
    stored = session.scalar(select(func.coalesce(func.sum(per_blob.c.size), 0)))
    return int(stored or 0) + int(session.scalar(receiving) or 0)


def open_uploads(session: Session, tenant_id: str) -> int:
    """The tenant's data uploads still receiving."""
    query = select(func.count()).where(
        DataUpload.tenant_id == tenant_id,
        DataUpload.status == DataUploadStatus.receiving.value,
    )
    return int(session.scalar(query) or 0)


def record_artifacts(session: Session, job_id: str, sizes: Mapping[str, int | None]) -> None:
    """The job refers to these blobs (digest -> size, None if not known): rows for the
    ones not recorded yet, and a size where it was not known."""
    known = {
        row.digest: row
        for row in session.scalars(select(JobArtifact).where(JobArtifact.job_id == job_id))
    }
    for digest, size in sizes.items():
        row = known.get(digest)
        if row is None:
            session.add(JobArtifact(job_id=job_id, digest=digest, size=size))
        elif row.size is None and size is not None:
            row.size = size
    session.flush()


def check_before_upload(
    session: Session,
    quotas: Quotas,
    tenant_id: str,
    content_length: str | int | None,
    idempotency_key: str | None = None,
    key_ttl_s: float | None = None,
) -> None:
    """Refuse before the body is read: the tenant is at its queued limit, or what it
    stores plus this body (its ``Content-Length``, when sent) would pass its limit. A
    request whose Idempotency-Key made a job already (less than ``key_ttl_s`` ago) is a
    retry, answered with that job: never refused."""
    if idempotency_key and keyed_job(session, tenant_id, idempotency_key, key_ttl_s):
        return
    content_length = _length(content_length)
    if quotas.max_queued_jobs:
        queued = queued_jobs(session, tenant_id)
        if queued >= quotas.max_queued_jobs:
            raise _too_many_queued(queued, quotas.max_queued_jobs)
    if quotas.max_stored_bytes:
        stored = stored_bytes(session, tenant_id)
        adding = max((content_length or 0) - MULTIPART_SLACK_BYTES, 0)
        if stored + adding > quotas.max_stored_bytes or stored >= quotas.max_stored_bytes:
            raise _over_storage(session, quotas, tenant_id, stored, adding)


def _length(value: str | int | None) -> int | None:
    """A Content-Length header's bytes; None when absent or not a number (the body's
    limits answer that one)."""
    if isinstance(value, int):
        return value
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def check_new_job(session: Session, quotas: Quotas, job: Job, upload_bytes: int) -> None:
    """After the insert of ``job`` and its artifact rows, in their transaction: refuse
    (the caller rolls back) if the tenant is now over a limit. ``upload_bytes``: what
    this upload stored, for the message."""
    if quotas.max_queued_jobs:
        queued = queued_jobs(session, job.tenant_id)
        if queued > quotas.max_queued_jobs:
            raise _too_many_queued(queued - 1, quotas.max_queued_jobs)
    if quotas.max_stored_bytes:
        stored = stored_bytes(session, job.tenant_id)
        if stored > quotas.max_stored_bytes:
            before = max(stored - upload_bytes, 0)
            raise _over_storage(session, quotas, job.tenant_id, before, upload_bytes)


def check_new_upload(session: Session, quotas: Quotas, tenant_id: str, size: int) -> None:
    """After the insert of a data upload of ``size`` bytes, in its transaction: refuse
    (the caller rolls back) if the tenant now has too many open uploads (429) or its
    stored bytes, this upload's size reserved, pass its limit (507). Lock the tenant's
    row (``lock_tenant``) before the insert."""
    if quotas.max_open_uploads:
        count = open_uploads(session, tenant_id)
        if count > quotas.max_open_uploads:
            raise _too_many_uploads(count - 1, quotas.max_open_uploads)
    if quotas.max_stored_bytes:
        stored = stored_bytes(session, tenant_id)
        if stored > quotas.max_stored_bytes:
            before = max(stored - size, 0)
            raise _over_storage(session, quotas, tenant_id, before, size)


def _too_many_uploads(count: int, limit: int) -> ProblemError:
    return ProblemError(
        429,
        "too-many-open-uploads",
        "Too many open uploads",
        f"this tenant has {count} data uploads still receiving, its limit "
        f"(max_open_uploads_per_tenant is {limit}); finish one (PATCH /v1/uploads/{{id}}) "
        "or delete one it no longer needs (DELETE /v1/uploads/{id}), then start again",
        headers={"Retry-After": str(QUEUED_RETRY_AFTER_S)},
        open_uploads=count,
        limit=limit,
    )


def _too_many_queued(queued: int, limit: int) -> ProblemError:
    return ProblemError(
        429,
        "too-many-queued-jobs",
        "Too many queued jobs",
        f"this tenant has {queued} job{'' if queued == 1 else 's'} queued, its limit "
        f"(max_queued_jobs_per_tenant is {limit}); submit again once one has started "
        "(Retry-After), or cancel or delete a queued job (POST /v1/jobs/{id}/cancel, "
        "DELETE /v1/jobs/{id})",
        headers={"Retry-After": str(QUEUED_RETRY_AFTER_S)},
        queued_jobs=queued,
        limit=limit,
    )


def _over_storage(
    session: Session, quotas: Quotas, tenant_id: str, stored: int, adding: int
) -> ProblemError:
    limit = quotas.max_stored_bytes
    upload = f"; this upload ({describe_bytes(adding)}) would pass" if adding else ", at or past"
    detail = (
        f"this tenant's jobs and data uploads store {describe_bytes(stored)} (models, "
        f"reports and data files){upload} its limit of {describe_bytes(limit)} "
        f"(max_stored_bytes_per_tenant = {limit}). Delete jobs you no longer need "
        "(DELETE /v1/jobs/{id}, `autofusion jobs delete ID`) and data uploads "
        "(DELETE /v1/uploads/{id})"
    )
    retry = _retention_frees_in(session, quotas, tenant_id)
    if quotas.job_retention_s:
        days = quotas.job_retention_s / 86400
        detail += f", or wait for retention: a job is deleted {days:g} days after it ended"
        if retry is not None:
            detail += f" (this tenant's oldest ended job goes in about {retry} s)"
    return ProblemError(
        507,
        "storage-quota-exceeded",
        "Storage quota exceeded",
        detail,
        headers={"Retry-After": str(retry)} if retry is not None else None,
        stored_bytes=stored,
        upload_bytes=adding,
        limit_bytes=limit,
    )


def _retention_frees_in(session: Session, quotas: Quotas, tenant_id: str) -> int | None:
    """Seconds until retention deletes the tenant's oldest ended job (then the sweep
    that removes it); None when retention is off or nothing has ended."""
    if not quotas.job_retention_s:
        return None
    ended = func.coalesce(Job.finished_at, Job.updated_at)
    oldest = session.scalar(
        select(func.min(ended)).where(Job.tenant_id == tenant_id, Job.status.in_(_FINAL))
    )
    if oldest is None:
        return None
    oldest = oldest if oldest.tzinfo is not None else oldest.replace(tzinfo=UTC)
    due: datetime = oldest + timedelta(seconds=quotas.job_retention_s)
    wait = (due - utcnow()).total_seconds() + quotas.sweep_interval_s
    return max(int(wait) + 1, 1)
