"""Retention (issue 26): what deletes jobs and the blobs of the artifact store.

- ``delete_job``: a tenant deletes one of its jobs (``DELETE /v1/jobs/{id}``) to free
  its quota; a running job answers 409 (cancel it first).
- ``sweep_retention``, by every reaper every ``scratch_sweep_interval_s`` (embedded mode
  too): the jobs that ended ``job_retention_s`` ago; then, while all jobs' blobs take
  more than ``max_stored_bytes_total``, the ended jobs that ended first; then the sizes
  not known yet; then the data uploads past their expiry (``upload_expiry_s`` after
  their last write), with their parts; then the blobs nothing refers to; then the
  automatic pattern rules whose evidence is no longer fresh
  (``pattern_class_rules.lapse_auto_rules``).

What is never deleted:

- a queued or running job: every delete is one conditional statement (``status`` is
  final, or for ``delete_job`` not running), so a job claimed meanwhile stays;
- a blob a job refers to (``JobArtifact``, and the digests on the job rows themselves),
  which covers what a running job reads: its model and data files; or a data upload
  does (a complete one's file, the parts of one still receiving);
- a blob stored within ``scratch_max_age_s``: an upload and a finishing attempt store
  their blobs (``put_file`` refreshes a blob that is already there) before their rows
  refer to them, so the blob an upload is about to refer to is never taken away.

A job's rows go at once; its blobs in the next sweeps, once no job refers to them and
they were last stored ``scratch_max_age_s`` ago. Sweeps of several reapers at once are
safe: each delete is conditional, and a blob gone already is not an error.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, aliased

from autofusion.app.core.db import session_scope
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import DataUpload, Job, JobArtifact, JobStatus, utcnow
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.pattern_class_rules import lapse_auto_rules
from autofusion.app.services.quotas import stored_bytes
from autofusion.app.services.uploads import expire_data_uploads, upload_digests

__all__ = ["RetentionSweep", "delete_job", "delete_jobs", "sweep_retention", "unique_bytes"]

logger = logging.getLogger(__name__)

_FINAL = [status.value for status in JobStatus if status.is_final]
_BATCH = 200  # jobs deleted (or sizes filled in) per transaction


@dataclass
class RetentionSweep:
    """What one sweep removed."""

    expired: list[str] = field(default_factory=list)  # jobs past job_retention_s
    over_total: list[str] = field(default_factory=list)  # jobs removed for the total cap
    sized: int = 0  # artifact sizes filled in
    uploads: list[str] = field(default_factory=list)  # data uploads past their expiry
    blobs: list[str] = field(default_factory=list)  # digests removed from the store
    # automatic pattern rules lapsed: (pattern, machine key)
    rules: list[tuple[str, str]] = field(default_factory=list)


def delete_job(session: Session, job: Job) -> None:
    """Delete the tenant's ``job`` (queued or ended) and its artifact rows; its blobs go
    in a later sweep. 409 while it runs."""
    if job.status != JobStatus.running.value and delete_jobs(session, [job.id], _NOT_RUNNING):
        return
    if session.scalar(select(Job.status).where(Job.id == job.id)) is None:
        # Deleted by another request (or retention) since it was read.
        raise ProblemError(404, "job-not-found", "Job not found", f"there is no job {job.id!r}")
    raise ProblemError(
        409,
        "job-running",
        "Job is running",
        f"job {job.id} is running and holds its files; cancel it first "
        f"(POST /v1/jobs/{job.id}/cancel), then delete it once it has ended",
    )


_NOT_RUNNING = [status.value for status in JobStatus if status != JobStatus.running]


def delete_jobs(
    session: Session, job_ids: Iterable[str], statuses: list[str] = _FINAL
) -> list[str]:
    """Delete those of ``job_ids`` whose status is in ``statuses`` (ended, by default),
    and their artifact rows; the ids deleted."""
    deleted = []
    for job_id in job_ids:
        # The condition is in the statement: a job claimed since it was read stays.
        result = session.execute(
            delete(Job)
            .where(Job.id == job_id, Job.status.in_(statuses))
            .execution_options(synchronize_session=False)
        )
        if result.rowcount == 1:
            # The foreign key cascades; said here too for a database that ignores it.
            session.execute(delete(JobArtifact).where(JobArtifact.job_id == job_id))
            deleted.append(job_id)
    session.flush()
    return deleted


def _ended() -> Any:
    return func.coalesce(Job.finished_at, Job.updated_at)


def expired_jobs(session: Session, cutoff: datetime, limit: int = _BATCH) -> list[str]:
    """Ended jobs that ended before ``cutoff``, oldest first."""
    query = (
        select(Job.id)
        .where(Job.status.in_(_FINAL), _ended() < cutoff)
        .order_by(_ended(), Job.id)
        .limit(limit)
    )
    return list(session.scalars(query))


def unique_bytes(session: Session, job_id: str) -> int:
    """The bytes of the job's blobs that no other job, and no data upload, refers to:
    what deleting it frees."""
    other = aliased(JobArtifact)
    shared = select(other.digest).where(other.digest == JobArtifact.digest, other.job_id != job_id)
    uploaded = select(DataUpload.digest).where(DataUpload.digest == JobArtifact.digest)
    query = select(func.coalesce(func.sum(JobArtifact.size), 0)).where(
        JobArtifact.job_id == job_id, ~shared.exists(), ~uploaded.exists()
    )
    return int(session.scalar(query) or 0)


def _delete_expired(url: str, retention_s: float, now: datetime) -> list[str]:
    cutoff = now - timedelta(seconds=retention_s)
    deleted: list[str] = []
    while True:
        with session_scope(url) as session:
            batch = expired_jobs(session, cutoff)
            deleted += delete_jobs(session, batch)
        if len(batch) < _BATCH:
            return deleted


def _trim_to_total(url: str, cap: int) -> list[str]:
    """Delete ended jobs, those that ended first first, until all jobs' blobs take at
    most ``cap`` bytes (or no ended job is left)."""
    with session_scope(url) as session:
        total = stored_bytes(session)
    deleted: list[str] = []
    while total > cap:
        with session_scope(url) as session:
            batch = expired_jobs(session, utcnow() + timedelta(days=1))
            for job_id in batch:
                freed = unique_bytes(session, job_id)
                if delete_jobs(session, [job_id]):
                    deleted.append(job_id)
                    total -= freed
                if total <= cap:
                    break
        if not batch:
            logger.warning(
                "retention: all jobs' artifacts take %d bytes, over max_stored_bytes_total "
                "(%d), and no ended job is left to delete",
                total,
                cap,
            )
            break
    return deleted


def _fill_sizes(url: str, store: ArtifactStore) -> int:
    """Ask the store the sizes not recorded yet (jobs stored before sizes were)."""
    with session_scope(url) as session:
        digests = list(
            session.scalars(
                select(JobArtifact.digest)
                .where(JobArtifact.size.is_(None))
                .distinct()
                .limit(_BATCH)
            )
        )
        sizes = {}
        for digest in digests:
            try:
                sizes[digest] = store.size(digest)
            except Exception:  # gone from the store (any store's error): it takes nothing
                sizes[digest] = 0
        for digest, size in sizes.items():
            rows = session.scalars(
                select(JobArtifact).where(JobArtifact.digest == digest, JobArtifact.size.is_(None))
            )
            for row in rows:
                row.size = size
    return len(sizes)


def _referenced(session: Session, digests: list[str]) -> set[str]:
    """Those of ``digests`` some job refers to: an artifact row, or the job row itself
    (a row written before artifact rows were, by a process of an older version); or a
    data upload."""
    found = upload_digests(session, digests)
    for start in range(0, len(digests), 500):
        chunk = digests[start : start + 500]
        found |= set(
            session.scalars(select(JobArtifact.digest).where(JobArtifact.digest.in_(chunk)))
        )
        for column in (Job.model_digest, Job.fused_digest, Job.report_digest):
            found |= set(session.scalars(select(column).where(column.in_(chunk))))
    return found


def _sweep_blobs(url: str, store: ArtifactStore, grace_s: float, now_s: float) -> list[str]:
    """Remove the blobs nothing refers to that were last stored ``grace_s`` ago."""
    stored_before = now_s - grace_s
    old = [blob.digest for blob in store.blobs() if blob.stored_at < stored_before]
    if not old:
        return []
    with session_scope(url) as session:
        referenced = _referenced(session, old)
    removed = []
    for digest in old:
        if digest in referenced:
            continue
        try:
            if store.delete(digest, stored_before=stored_before):
                removed.append(digest)
        except Exception as exc:  # one blob that cannot go now goes in a later sweep
            logger.warning("retention: could not remove blob %s: %s", digest, exc)
    return removed


def sweep_retention(
    settings: Any, store: ArtifactStore, *, now: datetime | None = None, now_s: float | None = None
) -> RetentionSweep:
    """One retention sweep (see the module docstring). ``settings``:
    app.core.config.Settings; ``now``/``now_s``: the clock, for tests."""
    url = settings.resolved_database_url
    now = now or utcnow()
    done = RetentionSweep()
    if settings.job_retention_s:
        done.expired = _delete_expired(url, settings.job_retention_s, now)
    if settings.max_stored_bytes_total:
        done.over_total = _trim_to_total(url, settings.max_stored_bytes_total)
    done.sized = _fill_sizes(url, store)
    done.uploads = expire_data_uploads(settings, store, now)
    current = time.time() if now_s is None else now_s
    done.blobs = _sweep_blobs(url, store, settings.scratch_max_age_s, current)
    with session_scope(url) as session:
        done.rules = lapse_auto_rules(session, settings, now=now)
    for what, ids in (("ended", done.expired), ("over the total cap", done.over_total)):
        if ids:
            logger.info("retention: deleted %d jobs (%s)", len(ids), what)
    if done.uploads:
        logger.info("retention: deleted %d data uploads past their expiry", len(done.uploads))
    if done.blobs:
        logger.info("retention: removed %d blobs nothing refers to", len(done.blobs))
    return done
