"""The embedded worker: a Celery worker thread and the reaper inside the API process.

Used by ``autofusion serve`` in embedded mode (kombu's ``filesystem://`` transport, no
servers). The worker runs the solo pool, so jobs run one at a time in its thread, each in
its own sandboxed child process. It installs no signal handlers: the API process owns
them and calls ``stop()``.

Celery keeps worker state in module globals, so a process runs at most one embedded
worker at a time (as ``celery.contrib.testing.worker`` does).
"""

from __future__ import annotations

import logging
import os
import socket
import threading

from celery import Celery
from celery.worker import WorkController
from celery.worker import state as worker_state

from autofusion.app.core.config import Settings, redact_url
from autofusion.app.services.artifacts import make_store
from autofusion.worker.celery_app import QUEUE
from autofusion.worker.reaper import Reaper
from autofusion.worker.tasks import enqueue_job

__all__ = ["EmbeddedWorker"]

logger = logging.getLogger(__name__)


class _ThreadWorkController(WorkController):
    """A WorkController that says when its consumer is ready."""

    def __init__(self, *args, **kwargs) -> None:
        self.consumer_ready = threading.Event()
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer) -> None:
        self.consumer_ready.set()


class EmbeddedWorker:
    def __init__(self, settings: Settings, celery: Celery) -> None:
        self.settings = settings
        self.celery = celery
        self.stopping = threading.Event()
        self.reaper = Reaper(settings, lambda job_id: enqueue_job(celery, job_id))
        self._controller: _ThreadWorkController | None = None
        self._thread: threading.Thread | None = None

    def start(self, timeout: float = 30.0) -> None:
        """Start consuming; returns once the worker is ready (or raises)."""
        self.stopping.clear()
        conf = self.celery.conf
        conf.autofusion_stop = self.stopping
        if conf.get("autofusion_store") is None:
            conf.autofusion_store = make_store(self.settings)
        self._controller = _ThreadWorkController(
            app=self.celery,
            hostname=f"embedded-{os.getpid()}@{socket.gethostname()}",
            pool="solo",
            concurrency=1,
            loglevel="WARNING",
            queues=[QUEUE],
            without_heartbeat=True,
            without_mingle=True,
            without_gossip=True,
        )
        self._thread = threading.Thread(target=self._run, name="autofusion-worker", daemon=True)
        self._thread.start()
        if not self._wait_ready(timeout):
            self.stop()
            raise RuntimeError(f"the embedded worker did not start within {timeout:g} s")
        self.reaper.start()
        logger.info("embedded worker started (%s)", redact_url(self.settings.resolved_broker_url))

    def _run(self) -> None:
        # The solo pool runs tasks in this thread and looks them up on the thread's
        # current app: make that ours, not Celery's default app. A task due later (a
        # held job's countdown: worker/turns.py) runs in the timer's own thread, which
        # has no current app and takes the default: ours too (one embedded worker a
        # process).
        self.celery.set_current()
        self.celery.set_default()
        assert self._controller is not None
        self._controller.start()

    def _wait_ready(self, timeout: float) -> bool:
        assert self._controller is not None and self._thread is not None
        waited = 0.0
        while waited < timeout:
            if self._controller.consumer_ready.wait(0.1):
                return True
            if not self._thread.is_alive():
                return False
            waited += 0.1
        return False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop within ``timeout``: a running job's child is killed and the job queued
        again (the attempt is not counted); the next start picks it up."""
        self.stopping.set()
        self.reaper.stop()
        if self._thread is None:
            return
        worker_state.should_terminate = 0  # read by the consumer loop between messages
        self._thread.join(timeout)
        if self._thread.is_alive():
            # Leave the flag set: the thread stops as soon as its loop comes round.
            logger.error("the embedded worker did not stop within %g s", timeout)
        else:
            worker_state.should_terminate = None
        self._thread = None
        self._controller = None
