"""The worker's Celery application: the publisher's (``app.core.queue.queue_app``) plus
the worker's side.

Tasks carry job ids only, JSON only (the publisher's settings), are acknowledged late
(after the job ends) and rejected back to the queue if the worker process dies, and each
worker prefetches one task at a time. The app includes ``autofusion.worker.tasks``, so a
worker started on it registers ``run_job``.
"""

from __future__ import annotations

from celery import Celery

from autofusion.app.core import tracing
from autofusion.app.core.config import Settings
from autofusion.app.core.queue import QUEUE, queue_app

__all__ = ["QUEUE", "make_celery"]


def make_celery(settings: Settings) -> Celery:
    app = queue_app(settings)
    app.conf.update(
        include=["autofusion.worker.tasks"],
        task_ignore_result=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
    )
    app.conf.autofusion_settings = settings
    # Decided as the worker starts, so that its log says at once whether it traces (and
    # which extra to install when it cannot); forked pool processes inherit the choice.
    tracing.setup()
    return app
