"""The embedded worker: a Celery worker thread and the reaper inside the API process.

Used by ``autofusion serve`` in embedded mode (kombu's ``filesystem://`` transport, no
servers). The worker runs the solo pool, so jobs run one at a time in its thread, each in
its own sandboxed child process. It installs no signal handlers: the API process owns
them and calls ``stop()``.

The thread supervises its consumer: when Celery's worker stops on an error it cannot
recover from (the broker's folder went missing, say), the thread starts a fresh one after
a backoff (``RestartBackoff``), logging each restart, until ``stop()``. Meanwhile
``problem()`` says why no job is taken (``/readyz``) and no heartbeat is written.

Celery keeps worker state in module globals, so a process runs at most one embedded
worker at a time (as ``celery.contrib.testing.worker`` does).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from celery import Celery
from celery.worker import WorkController
from celery.worker import state as worker_state

from autofusion.app.core.config import Settings, redact_url
from autofusion.app.services.artifacts import make_store
from autofusion.app.services.worker_health import WorkerIdentity
from autofusion.worker.celery_app import QUEUE
from autofusion.worker.heartbeat import Heartbeat
from autofusion.worker.reaper import Reaper
from autofusion.worker.tasks import enqueue_job

__all__ = ["EmbeddedWorker", "RestartBackoff"]

logger = logging.getLogger(__name__)


class _ThreadWorkController(WorkController):
    """A WorkController that says when its consumer is ready."""

    def __init__(self, *args, **kwargs) -> None:
        self.consumer_ready = threading.Event()
        super().__init__(*args, **kwargs)

    def on_consumer_ready(self, consumer) -> None:
        self.consumer_ready.set()


class RestartBackoff:
    """The wait before each restart: ``first_s``, then twice the last wait, at most
    ``cap_s``; a worker that ran for ``cap_s`` or longer before it died starts over from
    ``first_s`` (it was healthy; this is a new failure, not the same one again)."""

    def __init__(self, first_s: float, cap_s: float) -> None:
        self.first_s, self.cap_s = first_s, cap_s
        self._last: float | None = None

    def next_delay(self, ran_s: float) -> float:
        if self._last is None or ran_s >= self.cap_s:
            self._last = self.first_s
        else:
            self._last = min(self._last * 2, self.cap_s)
        return self._last


class EmbeddedWorker:
    def __init__(
        self, settings: Settings, celery: Celery, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.settings = settings
        self.celery = celery
        self.clock = clock
        self.stopping = threading.Event()
        self.reaper = Reaper(settings, lambda job_id: enqueue_job(celery, job_id))
        self.backoff = RestartBackoff(
            settings.embedded_worker_restart_min_s, settings.embedded_worker_restart_max_s
        )
        self.restarts = 0
        self.heartbeat = Heartbeat(
            settings, WorkerIdentity(mode="embedded", slots=1), alive=self.is_alive
        )
        self._controller: _ThreadWorkController | None = None
        self._thread: threading.Thread | None = None
        self._restart_at: float | None = None  # set while waiting to restart

    def start(self, timeout: float = 30.0) -> None:
        """Start consuming; returns once the worker is ready (or raises)."""
        self.stopping.clear()
        conf = self.celery.conf
        conf.autofusion_stop = self.stopping
        if conf.get("autofusion_store") is None:
            conf.autofusion_store = make_store(self.settings)
        self._controller = self._new_controller()
        self._thread = threading.Thread(
            target=self._supervise, name="autofusion-worker", daemon=True
        )
        self._thread.start()
        if not self._wait_ready(timeout):
            self.stop()
            raise RuntimeError(f"the embedded worker did not start within {timeout:g} s")
        self.reaper.start()
        self.heartbeat.start()
        logger.info("embedded worker started (%s)", redact_url(self.settings.resolved_broker_url))

    def _new_controller(self) -> _ThreadWorkController:
        return _ThreadWorkController(
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

    def _supervise(self) -> None:
        # The solo pool runs tasks in this thread and looks them up on the thread's
        # current app: make that ours, not Celery's default app. A task due later (a
        # held job's countdown: worker/turns.py) runs in the timer's own thread, which
        # has no current app and takes the default: ours too (one embedded worker a
        # process).
        self.celery.set_current()
        self.celery.set_default()
        while not self.stopping.is_set():
            started = self.clock()
            self._consume()
            if self.stopping.is_set():
                return
            delay = self.backoff.next_delay(self.clock() - started)
            self.restarts += 1
            logger.error(
                "embedded worker: the worker stopped unexpectedly; restart %d in %g s",
                self.restarts,
                delay,
            )
            self._restart_at = self.clock() + delay
            if self.stopping.wait(delay):
                return
            self._restart_at = None
            try:
                self._controller = self._new_controller()
            except Exception:  # e.g. the broker's folder is still missing: wait longer
                logger.exception("embedded worker: restart %d failed", self.restarts)
                self._controller = None

    def _consume(self) -> None:
        """Run the current controller until it stops (asked to, or on its own)."""
        controller = self._controller
        if controller is None:
            return
        try:
            controller.start()
        except Exception:  # Celery logs what it can; this is what it let through
            logger.exception("embedded worker: the worker failed")
        finally:
            controller.consumer_ready.clear()

    def _wait_ready(self, timeout: float) -> bool:
        assert self._controller is not None and self._thread is not None
        waited = 0.0
        while waited < timeout:
            if self._controller.consumer_ready.wait(0.1):
                return True
            if not self._thread.is_alive() or self._restart_at is not None:
                return False
            waited += 0.1
        return False

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def problem(self) -> str | None:
        """None while the worker takes jobs, else why not (``/readyz`` says it)."""
        if not self.running:
            return "the in-process worker is not running"
        restart_at = self._restart_at
        if restart_at is not None:
            wait = max(0.0, restart_at - self.clock())
            return (
                "the in-process worker stopped after an error (see the log); it restarts "
                f"in {wait:.1f} s (restart {self.restarts})"
            )
        controller = self._controller
        if controller is None or not controller.consumer_ready.is_set():
            return "the in-process worker is starting"
        return None

    def is_alive(self) -> bool:
        return self.problem() is None

    def stop(self, timeout: float = 10.0) -> None:
        """Stop within ``timeout``: a running job's child is killed and the job queued
        again (the attempt is not counted); the next start picks it up."""
        self.stopping.set()
        self.heartbeat.stop()
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
        self._restart_at = None
