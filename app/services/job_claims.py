"""Which job a worker takes next, and the running-jobs limit per tenant (issue 26).

A queue message names a job, but messages are first in, first out: a tenant that
queued twenty jobs would have every worker for hours before the job another tenant
sent a minute later. So a message is a turn, not a ticket: the worker that receives
it claims the job the fair order puts first (``pick_job``), and the message's own job
waits for a later turn. Every job was sent once, and every turn takes one job, so no
job waits for a message that will not come (the reaper re-sends any job queued for long
with no taker, as before).

The fair order, among the queued jobs whose tenant is below its running limit:

1. the tenant with the fewest running jobs;
2. among equals, the tenant that used the workers least in the last hour
   (``USAGE_WINDOW_S``: the seconds its jobs that started in it ran, or have run so
   far): a tenant that sends a small job now and then goes before tenants whose hostile
   or heavy jobs take the time limit each, so it waits behind the running jobs and its
   own work, not behind every other tenant's queue;
3. among equals, the tenant whose latest job started longest ago (never first): with
   one worker and nothing running, the tenants take turns;
4. that tenant's oldest job.

The running limit (``max_running_jobs_per_tenant``) is enforced by the claim itself
(``running_limit``, used by ``jobs.claim_job``) in the same statement as the
compare-and-set, behind a lock on the tenant's row, so two workers cannot both take a
tenant's last place. A job whose tenant is at its limit stays queued (*held*): the
turn that found it is sent again after ``held_job_retry_s`` (``hold_job`` marks the
row, so the reaper does not send it too) and the worker takes another message.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.orm import Session, aliased

from autofusion.app.core.models import Job, JobStatus, utcnow

__all__ = ["USAGE_WINDOW_S", "Pick", "hold_job", "is_held", "pick_job", "running_limit"]

# How far back a tenant's use of the workers counts in the fair order.
USAGE_WINDOW_S = 3600


@dataclass(frozen=True)
class Pick:
    """What a message's turn is for: ``job_id`` to claim (None: nothing can run now);
    ``held``: a queued job held back by its tenant's running limit, whose turn must come
    again (None: none is)."""

    job_id: str | None
    held: str | None = None


def _running_count(tenant: ColumnElement[str], now: datetime, exclude: ColumnElement[str]):
    """The tenant's jobs running under a live lease, ``exclude`` not counted (a job being
    claimed again after its lease expired is not its own competitor)."""
    other = aliased(Job)
    return (
        select(func.count())
        .select_from(other)
        .where(
            other.tenant_id == tenant,
            other.status == JobStatus.running.value,
            other.lease_until > now,
            other.id != exclude,
        )
        .scalar_subquery()
    )


def _recent_usage(now: datetime, dialect: str):
    """For a statement over ``Job``: the seconds the job's tenant's jobs that started in
    the last ``USAGE_WINDOW_S`` have run (a running one: so far)."""
    other = aliased(Job)
    end = func.coalesce(other.finished_at, now)
    if dialect == "postgresql":
        seconds = func.extract("epoch", end - other.started_at)
    else:  # SQLite keeps times as text; julianday reads them
        seconds = (func.julianday(end) - func.julianday(other.started_at)) * 86400.0
    return (
        select(func.coalesce(func.sum(seconds), 0.0))
        .where(
            other.tenant_id == Job.tenant_id,
            other.started_at >= now - timedelta(seconds=USAGE_WINDOW_S),
        )
        .scalar_subquery()
    )


def running_limit(max_running: int, now: datetime) -> ColumnElement[bool]:
    """For a statement over ``Job``: the job's tenant runs fewer than ``max_running``."""
    return _running_count(Job.tenant_id, now, Job.id) < max_running


def _claimable() -> list[ColumnElement[bool]]:
    return [
        Job.status == JobStatus.queued.value,
        Job.attempts < Job.max_attempts,
        Job.cancel_requested.is_(False),
    ]


def pick_job(
    session: Session, job_id: str, *, max_running: int, now: datetime | None = None
) -> Pick:
    """The job this turn should claim (the fair order above), and the held job whose
    turn must come again when nothing can run. 0: no running limit."""
    now = now or utcnow()
    started = aliased(Job)
    latest_start = (
        select(func.max(started.started_at))
        .where(started.tenant_id == Job.tenant_id)
        .scalar_subquery()
    )
    running = _running_count(Job.tenant_id, now, Job.id)
    query = select(Job.id).where(*_claimable())
    if max_running:
        query = query.where(running < max_running)
    usage = _recent_usage(now, session.get_bind().dialect.name)
    order = (running, usage, latest_start.asc().nulls_first(), Job.created_at, Job.id)
    chosen = session.scalar(query.order_by(*order).limit(1))
    if chosen is not None or not max_running:
        return Pick(chosen)
    if is_held(session, job_id, max_running=max_running, now=now):
        return Pick(None, job_id)
    oldest = select(Job.id).where(*_claimable()).order_by(Job.created_at, Job.id).limit(1)
    return Pick(None, session.scalar(oldest))


def is_held(
    session: Session, job_id: str, *, max_running: int, now: datetime | None = None
) -> bool:
    """Whether ``job_id`` is queued and could be claimed but for its tenant's running
    limit."""
    if not max_running:
        return False
    now = now or utcnow()
    query = select(Job.id).where(Job.id == job_id, *_claimable(), ~running_limit(max_running, now))
    return session.scalar(query) is not None


def hold_job(session: Session, job_id: str, now: datetime | None = None) -> None:
    """Mark a held job as just sent again (``updated_at``), so that the reaper, which
    re-sends jobs queued for long with no taker, leaves its turn to the worker. The
    revision stays: nothing a client sees has changed."""
    session.execute(
        update(Job)
        .where(Job.id == job_id, Job.status == JobStatus.queued.value)
        .values(updated_at=now or utcnow())
        .execution_options(synchronize_session=False)
    )
    session.flush()
