"""The reaper: requeues jobs whose worker died (their lease expired) and fails those out
of attempts, every ``reaper_interval_s``. Every worker process runs one; two reapers
requeueing the same job at once only send a duplicate message, which the claim absorbs.

It also sweeps the scratch folders of killed workers (``app.services.scratch``): on its
first pass, when the worker starts, and every ``scratch_sweep_interval_s`` after.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path

from app.core.config import Settings
from app.core.db import session_scope
from app.services.jobs import reap_jobs
from app.services.scratch import sweep_worker_scratch

__all__ = ["Reaper"]

logger = logging.getLogger(__name__)


class Reaper:
    def __init__(self, settings: Settings, enqueue: Callable[[str], None]) -> None:
        self.settings = settings
        self.enqueue = enqueue
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_sweep: float | None = None

    def sweep_once(self) -> list[Path]:
        """Remove the attempt folders of workers that are gone; returns what went."""
        self._last_sweep = time.monotonic()
        return sweep_worker_scratch(self.settings)

    def _sweep_due(self) -> bool:
        last = self._last_sweep
        return last is None or time.monotonic() - last >= self.settings.scratch_sweep_interval_s

    def run_once(self) -> list[str]:
        """One pass: returns the ids sent to the queue again."""
        with session_scope(self.settings.resolved_database_url) as session:
            job_ids = reap_jobs(session)
        for job_id in job_ids:
            logger.info("reaper: job %s queued again", job_id)
            self.enqueue(job_id)
        return job_ids

    def start(self) -> None:
        """Start the thread; a second call (a consumer that reconnected) does nothing."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="autofusion-reaper", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:  # the database or broker blinked: try again next time
                logger.exception("reaper pass failed")
            if self._sweep_due():
                try:
                    self.sweep_once()
                except Exception:  # a disk problem must not stop the reaper
                    logger.exception("scratch sweep failed")
            self._stop.wait(self.settings.reaper_interval_s)
