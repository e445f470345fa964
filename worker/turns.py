"""One queue message, one turn: which job the worker runs for it, and what it sends
back to the queue afterwards (``app/services/job_claims.py`` says why a message is a
turn rather than a ticket for the job it names).

``take_turn`` picks the job (the fair order, short of tenants at their running limit),
runs one attempt at it (``execute_job``, whose claim enforces the limit again, atomically)
and returns the messages to send: the job again at once when its attempt was requeued
or deferred; a held job after ``held_job_retry_s``; the message's own job at once when
another worker took the picked job first (the turn was not used).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.job_claims import hold_job, pick_job
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.snapshots import SnapshotCache

__all__ = ["Send", "take_turn"]


@dataclass(frozen=True)
class Send:
    """A message to send: ``job_id``, after ``countdown`` seconds (None: now)."""

    job_id: str
    countdown: float | None = None


def take_turn(
    settings: Settings,
    job_id: str,
    worker_id: str,
    store: ArtifactStore,
    *,
    stop: threading.Event | None = None,
    cache: SnapshotCache | None = None,
    trace: dict[str, str] | None = None,
) -> tuple[Outcome, list[Send]]:
    """Run the job this message's turn is for; the outcome and the messages to send.
    ``trace``: the message's trace context, which belongs to the message's own job."""
    limit = settings.max_running_jobs_per_tenant
    with session_scope(settings.resolved_database_url) as session:
        pick = pick_job(session, job_id, max_running=limit)
        if pick.job_id is None and pick.held is not None:
            hold_job(session, pick.held)  # its turn is on its way: the reaper need not send it
    target = pick.job_id or job_id
    if pick.job_id is None and pick.held is not None:
        # Nothing can run now: the held job's turn comes again (the message's own job's
        # claim would only be refused).
        return Outcome.held, [Send(pick.held, settings.held_job_retry_s)]
    trace = trace if target == job_id else None
    outcome = execute_job(settings, target, worker_id, store, stop=stop, cache=cache, trace=trace)
    if outcome.needs_enqueue:
        return outcome, [Send(target)]
    if outcome == Outcome.held:
        return outcome, [Send(target, settings.held_job_retry_s)]
    if outcome == Outcome.skipped and target != job_id:
        return outcome, [Send(job_id)]  # another worker took the pick: the turn is unused
    return outcome, []
