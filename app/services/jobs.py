"""The job state machine. The row is the source of truth, not the broker:

queued --claim--> running --finish--> succeeded | failed
   \\                 \\--lease expired, crash--> queued (attempts < max) | failed
    \\--cancel--> cancelled          running --cancel--> cancel_requested -> cancelled

A worker owns a job while its lease is unexpired; claiming is a compare-and-set on the
row, so a task delivered twice (at-least-once) runs once.

Each function writes and flushes; the caller owns the transaction and commits it (the
worker's ``session_scope``, the API's request session), so a step that reads the job back
or writes more in the same unit of work sees one consistent state.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, or_, select, update
from sqlalchemy.orm import Session

from autofusion.app.core.errors import JOB_PROBLEMS, ProblemError
from autofusion.app.core.logs import current_request_id
from autofusion.app.core.models import Job, JobStatus, PatternRecord, utcnow
from autofusion.app.services.auth import Principal
from autofusion.app.services.idempotency import key_expired
from autofusion.app.services.job_claims import running_limit
from autofusion.app.services.job_phases import first_phase
from autofusion.app.services.quotas import Quotas, check_new_job, lock_tenant, record_artifacts

__all__ = [
    "JOB_PROBLEMS",
    "cancel_job",
    "check_pattern_names",
    "claim_job",
    "create_job",
    "finish_job",
    "get_job",
    "reap_jobs",
    "release_job",
    "report_progress",
    "request_hash",
]

# Why a failed job failed: ``app.core.errors.JOB_PROBLEMS`` (the schemas read it too).


def request_hash(
    model_digest: str, data_files: list[dict], config: dict, strategy: str | None
) -> str:
    payload = json.dumps(
        {"model": model_digest, "data": data_files, "config": config, "strategy": strategy},
        sort_keys=True,
    )
    return hashlib.sha256(payload.encode()).hexdigest()


def create_job(
    session: Session,
    principal: Principal,
    *,
    model_name: str,
    model_digest: str,
    data_files: list[dict],
    config: dict[str, Any],
    strategy: str | None,
    idempotency_key: str | None,
    max_attempts: int,
    sizes: Mapping[str, int] | None = None,
    quotas: Quotas | None = None,
    key_ttl_s: float | None = None,
) -> tuple[Job, bool]:
    """Create a queued job, or return the job an identical earlier request created
    (less than ``key_ttl_s`` ago: an older one gives its key up to the new job).

    ``sizes``: the uploaded blobs' sizes by digest (recorded as the job's artifacts; one
    not given is filled in by the retention sweep). ``quotas``: refuse a new job that
    would put the tenant over its queued or stored limit (``app/services/quotas.py``);
    the caller rolls back."""
    if quotas is not None:  # before the insert: see quotas.py on why the lock comes first
        lock_tenant(session, principal.tenant_id)
    digest = request_hash(model_digest, data_files, config, strategy)
    if idempotency_key:
        existing = _job_of_key(session, principal.tenant_id, idempotency_key, digest, key_ttl_s)
        if existing is not None:
            return existing, False
    job = Job(
        id=str(uuid.uuid4()),
        tenant_id=principal.tenant_id,
        model_name=model_name,
        model_digest=model_digest,
        data_files=data_files,
        config=config,
        strategy=strategy,
        idempotency_key=idempotency_key,
        request_hash=digest,
        max_attempts=max_attempts,
        # The logging context's id: the request's (app/api/request_ids.py), so the worker
        # can log the job under it; None outside a request.
        request_id=current_request_id(),
    )
    session.add(job)
    session.flush()
    sizes = sizes or {}
    uploaded = [model_digest, *(f["digest"] for f in data_files)]
    record_artifacts(session, job.id, {d: sizes.get(d) for d in uploaded})
    if quotas is not None:
        check_new_job(session, quotas, job, sum(sizes.get(d) or 0 for d in set(uploaded)))
    return job, True


def _job_of_key(
    session: Session, tenant_id: str, key: str, digest: str, ttl_s: float | None
) -> Job | None:
    """The job an earlier request with this Idempotency-Key made; 422 if that request
    was a different one. A key older than ``ttl_s`` is taken from its job (which stays
    as it is) for the job this request makes: the unique key, and no stale replay."""
    existing = session.scalars(
        select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == key)
    ).first()
    if existing is not None and key_expired(existing, ttl_s):
        existing.idempotency_key = None
        session.flush()  # before the new job's insert takes the key
        return None
    if existing is not None and existing.request_hash != digest:
        raise ProblemError(
            422,
            "idempotency-key-reused",
            "Idempotency key reused",
            f"Idempotency-Key {key!r} was used for a different request "
            f"(job {existing.id}); send a new key for a new request",
        )
    return existing


def check_pattern_names(session: Session, config: dict[str, Any]) -> None:
    """422 now for the pattern names the worker would fail the job for later: each name in
    ``patterns`` and ``exclude`` must be an enabled pattern of the registry (the worker's
    snapshot holds only those) or one of the job's ``extra_patterns``."""
    asked = [
        (f"config.{field}.{i}", name)
        for field in ("patterns", "exclude")
        for i, name in enumerate(config.get(field) or [])
    ]
    if not asked:
        return
    extra = {
        spec.get("name") for spec in config.get("extra_patterns") or [] if isinstance(spec, dict)
    }
    rows = select(PatternRecord.name, PatternRecord.enabled).where(
        PatternRecord.deleted.is_(False), PatternRecord.name.in_({name for _, name in asked})
    )
    enabled = {name: on for name, on in session.execute(rows)}
    errors = [
        {"field": field, "message": _pattern_problem(name, name in enabled)}
        for field, name in asked
        if name not in extra and not enabled.get(name)
    ]
    if errors:
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        raise ProblemError(422, "invalid-config", "Invalid config", detail, errors=errors)


def _pattern_problem(name: str, disabled: bool) -> str:
    if disabled:
        return f"pattern {name!r} is disabled: enable it or leave it out of the config"
    return f"there is no pattern {name!r}: GET /v1/patterns lists them"


def get_job(session: Session, tenant_id: str, job_id: str) -> Job:
    """The tenant's job; another tenant's job is as absent as a missing one."""
    job = session.get(Job, job_id)
    if job is None or job.tenant_id != tenant_id:
        raise ProblemError(404, "job-not-found", "Job not found", f"there is no job {job_id!r}")
    return job


def _touch(job: Job) -> None:
    job.revision += 1
    job.updated_at = utcnow()


def cancel_job(session: Session, job: Job) -> Job:
    if JobStatus(job.status).is_final:
        raise ProblemError(
            409, "job-finished", "Job already finished", f"job {job.id} is already {job.status}"
        )
    if job.status == JobStatus.queued:
        job.status, job.stage, job.finished_at = JobStatus.cancelled.value, "cancelled", utcnow()
    else:
        job.cancel_requested = True  # the worker stops at its next progress report
    _touch(job)
    session.flush()
    return job


def claim_job(
    session: Session, job_id: str, worker_id: str, lease_s: int, *, max_running: int = 0
) -> Job | None:
    """Compare-and-set: take a queued job (or one whose lease expired). None if taken.

    ``max_running`` (0: no limit): None too while the job's tenant runs that many jobs
    (``job_claims``); the tenant's row is locked first, so that two workers cannot both
    take its last place."""
    now = utcnow()
    conditions = [
        Job.id == job_id,
        Job.attempts < Job.max_attempts,
        Job.cancel_requested.is_(False),
        or_(
            Job.status == JobStatus.queued.value,
            and_(Job.status == JobStatus.running.value, Job.lease_until < now),
        ),
    ]
    if max_running:
        tenant_id = session.scalar(select(Job.tenant_id).where(Job.id == job_id))
        if tenant_id is None:
            return None
        lock_tenant(session, tenant_id)
        conditions.append(running_limit(max_running, now))
    result = session.execute(
        update(Job)
        .where(*conditions)
        .values(
            status=JobStatus.running.value,
            stage="starting",
            attempts=Job.attempts + 1,
            worker_id=worker_id,
            lease_until=now + timedelta(seconds=lease_s),
            started_at=now,
            phases=first_phase(now),
            updated_at=now,
            revision=Job.revision + 1,
        )
        .execution_options(synchronize_session=False)
    )
    session.flush()
    if result.rowcount != 1:
        return None
    return session.get(Job, job_id, populate_existing=True)


def report_progress(
    session: Session,
    job_id: str,
    worker_id: str,
    stage: str,
    progress: float,
    lease_s: int,
    *,
    registry_version: int | None = None,
    phases: list[dict[str, str]] | None = None,
) -> bool:
    """Record progress and renew the lease. False: the job was cancelled or lost.

    ``registry_version``: the registry snapshot the job uses, recorded when it starts;
    ``phases``: the attempt's phases when a new one began (app/services/job_phases.py).
    """
    now = utcnow()
    values: dict[str, Any] = {}
    if registry_version is not None:
        values["registry_version"] = registry_version
    if phases is not None:
        values["phases"] = phases
    result = session.execute(
        update(Job)
        .where(
            Job.id == job_id,
            Job.worker_id == worker_id,
            Job.status == JobStatus.running.value,
            Job.cancel_requested.is_(False),
        )
        .values(
            stage=stage,
            progress=max(0.0, min(1.0, progress)),
            lease_until=now + timedelta(seconds=lease_s),
            updated_at=now,
            revision=Job.revision + 1,
            **values,
        )
        .execution_options(synchronize_session=False)
    )
    session.flush()
    return result.rowcount == 1


def finish_job(
    session: Session,
    job_id: str,
    worker_id: str,
    *,
    status: JobStatus,
    summary: dict | None = None,
    error: str | None = None,
    fused_digest: str | None = None,
    report_digest: str | None = None,
    registry_version: int | None = None,
    error_type: str | None = None,
    attempt_entry: dict[str, Any] | None = None,
    stored: Mapping[str, int] | None = None,
) -> bool:
    """Write the outcome, if this worker still owns the job.

    ``error_type``: a failed job's problem slug (``JOB_PROBLEMS``); ``attempt_entry``:
    this attempt's outcome, appended to ``Job.attempt_log`` when it ended without a result;
    ``stored``: the blobs the attempt stored (digest -> size), recorded as the job's
    artifacts (what its tenant stores, and what retention keeps while the job exists).
    """
    job = session.get(Job, job_id, populate_existing=True)
    if job is None or job.worker_id != worker_id or job.status != JobStatus.running.value:
        return False
    if job.cancel_requested and status != JobStatus.failed:
        status = JobStatus.cancelled
    job.status, job.stage = status.value, status.value
    job.progress = 1.0 if status == JobStatus.succeeded else job.progress
    job.finished_at, job.lease_until = utcnow(), None
    job.summary, job.error = summary, error
    job.error_type = error_type if status == JobStatus.failed else None
    if attempt_entry is not None:
        job.attempt_log = [*(job.attempt_log or []), attempt_entry]
    job.fused_digest, job.report_digest = fused_digest, report_digest
    if registry_version is not None:
        job.registry_version = registry_version
    _touch(job)
    session.flush()
    if stored:
        record_artifacts(session, job_id, stored)
    return True


def release_job(
    session: Session,
    job_id: str,
    worker_id: str,
    *,
    error: str | None = None,
    error_type: str | None = None,
    count_attempt: bool = True,
    attempt_log: list[dict[str, Any]] | None = None,
) -> bool:
    """Put a job this worker owns back to queued (its attempt crashed, or the worker is
    stopping: then ``count_attempt=False`` gives the attempt back). False if not owned.
    ``error_type``: the failed attempt's problem slug (``JOB_PROBLEMS``).
    ``attempt_log`` replaces the job's log of attempt outcomes (the owner's read of it,
    plus this attempt: only the lease holder writes it)."""
    values: dict[str, Any] = {
        "status": JobStatus.queued.value,
        "stage": "queued",
        "progress": 0.0,
        "worker_id": None,
        "lease_until": None,
        "updated_at": utcnow(),
        "revision": Job.revision + 1,
    }
    if error is not None:  # why the attempt failed: the job's error while it waits
        values["error"], values["error_type"] = error, error_type
    if not count_attempt:
        values["attempts"] = Job.attempts - 1
    if attempt_log is not None:
        values["attempt_log"] = attempt_log
    result = session.execute(
        update(Job)
        .where(
            Job.id == job_id,
            Job.worker_id == worker_id,
            Job.status == JobStatus.running.value,
            Job.cancel_requested.is_(False),
        )
        .values(**values)
        .execution_options(synchronize_session=False)
    )
    session.flush()
    return result.rowcount == 1


def reap_jobs(
    session: Session,
    now: datetime | None = None,
    stale_queued_s: int = 60,
    busy_resend_s: float = 1800.0,
) -> list[str]:
    """Requeue jobs whose worker died (lease expired); fail those out of attempts.

    Returns the ids to enqueue again. Queued jobs whose message was plausibly lost are
    returned too (``_lost_queued``).
    """
    now = now or utcnow()
    expired = session.scalars(
        select(Job).where(Job.status == JobStatus.running.value, Job.lease_until < now)
    ).all()
    requeue = []
    for job in expired:
        lost = {"attempt": job.attempts, "outcome": "lost", "stage": job.stage}
        if not job.cancel_requested:  # the attempt's outcome, as for a crash the worker saw
            job.attempt_log = [*(job.attempt_log or []), lost | {"model_digest": job.model_digest}]
        if job.cancel_requested:
            job.status, job.stage, job.finished_at = JobStatus.cancelled.value, "cancelled", now
        elif job.attempts >= job.max_attempts:
            job.status, job.stage, job.finished_at = JobStatus.failed.value, "failed", now
            job.error = (
                f"the job's worker stopped {job.attempts} time(s) before finishing "
                "(crash, kill or out of memory); it will not be retried"
            )
            job.error_type = "worker-lost"
        else:
            job.status, job.stage, job.worker_id = JobStatus.queued.value, "queued", None
            requeue.append(job.id)
        job.lease_until = None
        _touch(job)
    session.flush()
    stale = _lost_queued(session, now, stale_queued_s, busy_resend_s)
    return requeue + [j for j in stale if j not in requeue]


def _lost_queued(
    session: Session, now: datetime, stale_queued_s: float, busy_resend_s: float
) -> list[str]:
    """Queued jobs to send again, in case their message was lost (issue 26).

    While a job runs under a live lease the workers are busy, and a queued job waits
    behind them with its message in the broker: sending it every pass only piles up
    duplicates. So a job untouched (not sent, not changed) for ``stale_queued_s`` is
    sent again only when nothing runs (idle workers would have taken it); while the
    workers are busy, only after ``busy_resend_s``, so that a message lost then is
    still found. Each send stamps ``updated_at``: the wait starts over.
    """
    running = (Job.status == JobStatus.running.value, Job.lease_until >= now)
    busy = session.scalar(select(Job.id).where(*running).limit(1))
    wait_s = busy_resend_s if busy is not None else stale_queued_s
    stale = session.scalars(
        select(Job.id).where(
            Job.status == JobStatus.queued.value,
            Job.updated_at < now - timedelta(seconds=wait_s),
        )
    ).all()
    if stale:
        session.execute(
            update(Job)
            .where(Job.id.in_(stale), Job.status == JobStatus.queued.value)
            .values(updated_at=now)
            .execution_options(synchronize_session=False)
        )
        session.flush()
    return list(stale)
