"""A worker process's heartbeat: its row in ``worker_heartbeats``, rewritten every
``worker_heartbeat_interval_s`` from a small thread (``app.services.worker_health``
reads the rows: ``/readyz``, the dashboard's banner, a queued job's reason).

``alive`` says whether the worker can take a job now: while it says no (the embedded
worker's consumer died and waits for its restart) no beat is written, so the row grows
stale as a dead process's would. A clean stop removes the row at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from celery.worker import state as worker_state

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.services.scratch import PeriodicThread
from autofusion.app.services.worker_health import (
    WorkerIdentity,
    record_heartbeat,
    remove_heartbeat,
)

__all__ = ["Heartbeat", "running_tasks"]

logger = logging.getLogger(__name__)


def running_tasks() -> int:
    """Tasks this worker process has accepted and not finished (Celery's own count)."""
    return len(worker_state.active_requests)


class Heartbeat:
    def __init__(
        self,
        settings: Settings,
        identity: WorkerIdentity,
        *,
        alive: Callable[[], bool] = lambda: True,
        running: Callable[[], int] = running_tasks,
    ) -> None:
        self.settings, self.identity = settings, identity
        self.alive, self.running = alive, running
        self._thread = PeriodicThread(
            self.beat_once, settings.worker_heartbeat_interval_s, "autofusion-heartbeat"
        )

    def beat_once(self) -> bool:
        """Write the row now if the worker is alive; whether it was written."""
        if not self.alive():
            return False
        with session_scope(self.settings.resolved_database_url) as session:
            record_heartbeat(
                session,
                self.identity,
                self.running(),
                stale_after_s=self.settings.worker_stale_after_s,
            )
        return True

    def start(self) -> None:
        """Beat now (a probe right after start sees this worker), then from the thread."""
        try:
            self.beat_once()
        except Exception:  # the database blinked: the thread's next beat tries again
            logger.exception("heartbeat: the first beat failed")
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()
        try:
            with session_scope(self.settings.resolved_database_url) as session:
                remove_heartbeat(session, self.identity)
        except Exception:  # the row goes stale instead: the same answer, later
            logger.warning("heartbeat: could not remove this worker's row", exc_info=True)
