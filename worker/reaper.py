"""The reaper: requeues jobs whose worker died (their lease expired) and fails those out
of attempts, every ``reaper_interval_s``. Every worker process runs one; two reapers
requeueing the same job at once only send a duplicate message, which the claim absorbs.

It also sweeps the scratch folders of killed workers (``app.services.scratch``) and
applies retention (``app.services.retention``: ended jobs past ``job_retention_s`` or
over ``max_stored_bytes_total``, and the blobs no job refers to): on its first pass,
when the worker starts, and every ``scratch_sweep_interval_s`` after.

A thread beside it delivers the webhooks of ended jobs (``app.services.webhooks``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.services.artifacts import ArtifactStore, make_store
from autofusion.app.services.jobs import reap_jobs
from autofusion.app.services.retention import RetentionSweep, sweep_retention
from autofusion.app.services.scratch import PeriodicThread, ScratchSweeper, sweep_worker_scratch
from autofusion.app.services.webhooks import deliver_due

__all__ = ["Reaper"]

logger = logging.getLogger(__name__)


class Reaper:
    def __init__(
        self,
        settings: Settings,
        enqueue: Callable[[str], None],
        store: ArtifactStore | None = None,
    ) -> None:
        self.settings = settings
        self.enqueue = enqueue
        self.store = store or make_store(settings)
        self._sweeper = ScratchSweeper(
            lambda: sweep_worker_scratch(settings), settings.scratch_sweep_interval_s
        )
        self._retention = ScratchSweeper(self._retain_due, settings.scratch_sweep_interval_s)
        self._thread = PeriodicThread(self._turn, settings.reaper_interval_s, "autofusion-reaper")
        # Webhooks go out from a thread of their own: a slow receiver delays neither the
        # reaper's pass nor a job (app/services/webhooks). With webhooks off it only
        # closes callbacks left from before, so it looks less often.
        poll_s = settings.webhook_poll_s if settings.webhook_allowed_hosts else 30.0
        self._webhooks = PeriodicThread(
            lambda: deliver_due(settings), poll_s, "autofusion-webhooks"
        )

    def sweep_once(self) -> list[Path]:
        """Remove the attempt folders of workers that are gone; returns what went."""
        self._sweeper.last_run = self._sweeper.clock()
        return sweep_worker_scratch(self.settings)

    def retain_once(self) -> RetentionSweep:
        """One retention sweep; returns what it removed."""
        self._retention.last_run = self._retention.clock()
        return sweep_retention(self.settings, self.store)

    def _retain_due(self) -> list[RetentionSweep]:
        try:
            return [sweep_retention(self.settings, self.store)]
        except Exception:  # the database or the store blinked: the next sweep tries again
            logger.exception("retention sweep failed")
            return []

    def run_once(self) -> list[str]:
        """One pass: returns the ids sent to the queue again."""
        with session_scope(self.settings.resolved_database_url) as session:
            job_ids = reap_jobs(session, busy_resend_s=self.settings.queued_resend_busy_s)
        for job_id in job_ids:
            logger.info("reaper: job %s queued again", job_id)
            self.enqueue(job_id)
        return job_ids

    def start(self) -> None:
        """Start the thread; a second call (a consumer that reconnected) does nothing."""
        self._thread.start()
        self._webhooks.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._thread.stop(timeout)
        self._webhooks.stop(timeout)

    def _turn(self) -> None:
        try:
            self.run_once()
        finally:  # the database or broker blinked: the sweeps still come when they are due
            self._sweeper.run_due()
            self._retention.run_due()
