"""Whether any worker can take a job: the heartbeats workers write, read by ``/readyz``,
the dashboard's banner and a queued job's ``waiting`` reason (issue 27).

Every worker process (the embedded thread, each ``autofusion worker``) rewrites its row
of ``worker_heartbeats`` every ``worker_heartbeat_interval_s`` (``worker/heartbeat.py``);
a row younger than ``worker_stale_after_s`` is a live worker. A worker that died leaves a
row that only grows old, so nothing has to notice the death: its silence is the signal.
Rows silent for much longer than that are removed by the live workers' next beats.

The API process never imports the worker: the embedded worker beside it (when there is
one) is seen through ``LocalWorker``, which the composition root hands to the app.
"""

from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Protocol

from sqlalchemy import ColumnElement, case, delete, func, select
from sqlalchemy.orm import Session, aliased

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.models import Job, JobStatus, WorkerHeartbeat, utcnow
from autofusion.app.services.jobs import get_job

__all__ = [
    "LocalWorker",
    "WorkerIdentity",
    "WorkerStatus",
    "check_worker",
    "job_with_waiting",
    "no_worker_reason",
    "record_heartbeat",
    "remove_heartbeat",
    "worker_status",
]

logger = logging.getLogger(__name__)

# A row silent this many times worker_stale_after_s is a worker gone for good: removed.
_FORGET_AFTER_STALE = 20

START_ONE = "start one with `autofusion worker` (or `autofusion serve` with its in-process worker)"


class LocalWorker(Protocol):
    """The embedded worker as the API process sees it."""

    def problem(self) -> str | None:
        """None while it can take a job, else why not (stopped, restarting...)."""


@dataclass(frozen=True)
class WorkerIdentity:
    """Who beats: one row per worker process."""

    mode: str  # embedded, distributed
    slots: int  # jobs it runs at once at most
    host: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)
    started_at: datetime = field(default_factory=utcnow)

    @property
    def name(self) -> str:
        return f"{self.host}/{self.pid}"[:255]


def record_heartbeat(
    session: Session, me: WorkerIdentity, running: int, *, stale_after_s: float
) -> None:
    """Write this worker's row (now alive, ``running`` jobs) and drop long-silent rows."""
    now = utcnow()
    row = session.get(WorkerHeartbeat, me.name)
    if row is None:
        row = WorkerHeartbeat(name=me.name, host=me.host[:255], pid=me.pid, mode=me.mode)
        row.started_at = me.started_at
        session.add(row)
    row.last_seen, row.running, row.slots = now, running, me.slots
    forget_before = now - timedelta(seconds=stale_after_s * _FORGET_AFTER_STALE)
    session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.last_seen < forget_before))
    session.flush()


def remove_heartbeat(session: Session, me: WorkerIdentity) -> None:
    """A worker that stops cleanly says so at once, instead of going stale."""
    session.execute(delete(WorkerHeartbeat).where(WorkerHeartbeat.name == me.name))


@dataclass(frozen=True)
class WorkerStatus:
    alive: int  # workers with a fresh heartbeat
    last_seen: datetime | None  # the newest heartbeat of any worker, fresh or not


def _fresh_since(stale_after_s: float, now: datetime) -> datetime:
    return now - timedelta(seconds=stale_after_s)


def worker_status(session: Session, stale_after_s: float) -> WorkerStatus:
    """One statement: how many workers are alive, and when one was last heard of."""
    fresh = WorkerHeartbeat.last_seen >= _fresh_since(stale_after_s, utcnow())
    alive, last_seen = session.execute(
        select(func.count(case((fresh, 1))), func.max(WorkerHeartbeat.last_seen))
    ).one()
    if last_seen is not None and last_seen.tzinfo is None:  # SQLite: naive, stored as UTC
        last_seen = last_seen.replace(tzinfo=UTC)
    return WorkerStatus(alive=alive or 0, last_seen=last_seen)


def no_worker_reason(status: WorkerStatus, stale_after_s: float) -> str | None:
    """None while a worker is alive, else what an operator should read and do."""
    if status.alive:
        return None
    if status.last_seen is None:
        return f"no worker has reported in yet; {START_ONE}"
    silent = max(stale_after_s, (utcnow() - status.last_seen).total_seconds())
    return f"no worker has reported in {silent:.0f} s; {START_ONE}"


def check_worker(settings: Settings, local: LocalWorker | None = None) -> str | None:
    """Readiness: None while a worker can take a job. The embedded worker beside this
    process answers for itself first (a dead thread is known at once, before its
    heartbeat grows stale); then any live worker's heartbeat counts."""
    # A companion that is no LocalWorker (one that yields None) says nothing here.
    problem = getattr(local, "problem", None)
    if problem is not None and (reason := problem()):
        return reason
    try:
        with session_scope(settings.resolved_database_url) as session:
            status = worker_status(session, settings.worker_stale_after_s)
    except Exception as exc:  # the database check says why; no credentials in a type name
        logger.warning("readiness: worker heartbeats unreadable (%s)", type(exc).__name__)
        return f"worker heartbeats unreadable ({type(exc).__name__})"
    return no_worker_reason(status, settings.worker_stale_after_s)


def _when_queued(query) -> ColumnElement:
    # Computed for a queued job only: both databases evaluate a CASE branch lazily.
    return case((Job.status == JobStatus.queued.value, query.scalar_subquery()))


def _waiting_columns(settings: Settings, now: datetime) -> list[ColumnElement]:
    """Beside the job row, in the same statement: live workers, the job's tenant's
    running jobs, and the queued jobs older than it."""
    fresh = WorkerHeartbeat.last_seen >= _fresh_since(settings.worker_stale_after_s, now)
    alive = select(func.count()).select_from(WorkerHeartbeat).where(fresh)
    other = aliased(Job)
    running = (
        select(func.count())
        .select_from(other)
        .where(
            other.tenant_id == Job.tenant_id,
            other.status == JobStatus.running.value,
            other.lease_until > now,
        )
    )
    ahead = (
        select(func.count())
        .select_from(other)
        .where(
            other.status == JobStatus.queued.value,
            other.cancel_requested.is_(False),
            other.created_at < Job.created_at,
        )
    )
    return [_when_queued(alive), _when_queued(running), _when_queued(ahead)]


def _waiting(settings: Settings, alive: int, running: int, ahead: int) -> str:
    if not alive:
        return "no worker is alive: the job starts once one is (`autofusion worker`)"
    limit = settings.max_running_jobs_per_tenant
    if limit and running >= limit:
        return f"held: tenant at its running limit ({limit})"
    if ahead:
        return f"waiting for a free worker ({ahead} job{'s' if ahead != 1 else ''} ahead)"
    return "waiting for a free worker (next in line)"


def job_with_waiting(
    session: Session, tenant_id: str, job_id: str, settings: Settings
) -> tuple[Job, str | None]:
    """The tenant's job and, while it is queued, why it waits; one statement (a poll's
    budget: tests/app/test_poll_queries.py)."""
    row = session.execute(
        select(Job, *_waiting_columns(settings, utcnow())).where(Job.id == job_id)
    ).one_or_none()
    job = get_job(session, tenant_id, job_id)  # the row is in the session now: no query
    if row is None or job.status != JobStatus.queued.value or job.cancel_requested:
        return job, None
    _, alive, running, ahead = row
    return job, _waiting(settings, alive or 0, running or 0, ahead or 0)
