"""Celery tasks: thin adapters that take a job id and hand it to ``take_turn``
(``worker.turns``: the message is a turn, the job run is the one the fair order picks).

The task is registered under ``RUN_JOB`` (``app.core.queue``, where the API publishes it
by name) on every app ``make_celery`` builds (it includes this module);
the app carries the service's Settings as ``conf.autofusion_settings`` and, where the
process made them, an artifact store (``conf.autofusion_store``) and a stop event
(``conf.autofusion_stop``, the embedded worker's shutdown).
"""

from __future__ import annotations

import os
import socket
import uuid

from celery import shared_task

from autofusion.app.core import tracing
from autofusion.app.core.queue import RUN_JOB, publish_job
from autofusion.app.services.artifacts import make_store
from autofusion.worker.turns import take_turn

__all__ = ["RUN_JOB", "enqueue_job", "run_job"]

# The worker publishes as the API does (a job tried again, the reaper's re-enqueue): by name.
enqueue_job = publish_job


@shared_task(
    name=RUN_JOB,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def run_job(self, job_id: str) -> str:
    """One attempt at a job; the rows, not this message, say whether there is work."""
    conf = self.app.conf
    settings = conf.autofusion_settings
    store = conf.get("autofusion_store") or make_store(settings)
    trace = _trace_headers(self.request)
    outcome, sends = take_turn(
        settings,
        job_id,
        _worker_id(self.request),
        store,
        stop=conf.get("autofusion_stop"),
        trace=trace,
    )
    for send in sends:
        # The job sent again stays in its request's trace (only this message's job's).
        with tracing.attached(trace if send.job_id == job_id else None):
            enqueue_job(self.app, send.job_id, countdown=send.countdown)
    return outcome.value


def _trace_headers(request) -> dict[str, str]:
    """The trace context the publisher sent in the message's headers (``publish_job``);
    empty when it sent none (tracing off there, or the reaper's re-send)."""
    headers = getattr(request, "headers", None) or {}
    return {k: v for k, v in headers.items() if isinstance(k, str) and isinstance(v, str)}


def _worker_id(request) -> str:
    """Unique per attempt: node, process, and the message being handled."""
    node = request.hostname or socket.gethostname()
    return f"{node}/{os.getpid()}/{(request.id or uuid.uuid4().hex)[:12]}"[:200]
