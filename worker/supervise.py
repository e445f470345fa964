"""Run the sandbox child and watch it: progress lines, a wall-clock limit, and a
heartbeat that lets the caller renew its lease even while the child is silent.

The child runs in its own session (a Ctrl-C or SIGTERM meant for the worker does not
reach it; a timeout kills its whole process group, and so does its end, so nothing it
started outlives it) and limits its own address space first thing (``worker.sandbox``):
``preexec_fn`` is unsafe in a threaded process, and the embedded worker is one. It
starts with an allow-listed environment (``app.services.sandbox_env``: no
``DATABASE_URL``, ``REDIS_URL``, ``PGPASSWORD``, ``AWS_*`` or ``AUTOFUSION_*`` setting;
``HOME`` is its job folder) and umask 077, so what it writes is readable by the
service's user only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from autofusion.app.services.sandbox_env import CHILD_UMASK, log_tail, sandbox_environment
from autofusion.worker.sandbox import INPUT_DIR, LOG_FILE, TEST_CRASH_ENV

__all__ = ["ChildRun", "child_environment", "run_child"]

logger = logging.getLogger(__name__)

# Called with (stage, progress) for each progress line and on each heartbeat; returning
# False abandons the run (the job was cancelled or is no longer ours).
Report = Callable[[str, float], bool]


@dataclass(frozen=True)
class ChildRun:
    # exited: look at returncode and the output folder. timeout: killed at the limit.
    # abandoned: killed because report() said so. stopped: killed because the worker stops.
    status: Literal["exited", "timeout", "abandoned", "stopped"]
    returncode: int | None
    seconds: float
    log_tail: str


def child_environment(folder: Path) -> dict[str, str]:
    """The sandbox's allow-listed environment (no credentials); ``HOME`` is ``folder``.

    The test-only crash hook passes through: the worker sets it nowhere.
    """
    return sandbox_environment(folder, keep=(TEST_CRASH_ENV,))


def run_child(
    folder: Path,
    *,
    time_limit_s: float,
    heartbeat_s: float,
    report: Report,
    should_stop: Callable[[], bool] = lambda: False,
) -> ChildRun:
    """Run ``python -m autofusion.worker.sandbox folder`` until it exits or must be killed."""
    start = time.monotonic()
    with open(folder / LOG_FILE, "wb") as log:
        proc = subprocess.Popen(
            # -P: the working directory holds the user's files (a data file may well be
            # called json.py); it must not go on sys.path.
            [sys.executable, "-P", "-m", "autofusion.worker.sandbox", str(folder)],
            # onnxruntime resolves the external-data references of a model it is handed
            # as bytes (fusion_core's check does that) against the working directory.
            cwd=folder / INPUT_DIR,
            env=child_environment(folder),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            umask=CHILD_UMASK,
        )
    try:
        status = _watch(proc, start + time_limit_s, heartbeat_s, report, should_stop)
    finally:
        _kill(proc)  # the group too: whatever the child started goes with it
        proc.stdout.close()
    seconds = time.monotonic() - start
    return ChildRun(status, proc.returncode, seconds, log_tail(folder / LOG_FILE, 4000))


def _watch(
    proc: subprocess.Popen,
    deadline: float,
    heartbeat_s: float,
    report: Report,
    should_stop: Callable[[], bool],
) -> Literal["exited", "timeout", "abandoned", "stopped"]:
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    lines = _Lines()
    last_report = time.monotonic()
    try:
        while True:
            now = time.monotonic()
            if now >= deadline:
                return "timeout"
            if should_stop():
                return "stopped"
            ready = not lines.eof and selector.select(timeout=min(0.25, deadline - now))
            if ready:
                lines.feed(_read(fd))
            for stage, progress in lines.progress():
                if not report(stage, progress):
                    return "abandoned"
                last_report = time.monotonic()
            if time.monotonic() - last_report >= heartbeat_s:
                if not report(lines.stage, lines.fraction):
                    return "abandoned"
                last_report = time.monotonic()
            if (lines.eof or not ready) and proc.poll() is not None:
                return "exited"
            if lines.eof:
                time.sleep(0.05)  # stdout is closed: the process is on its way out
    finally:
        selector.close()


class _Lines:
    """Splits the child's stdout into progress records; ignores anything else."""

    def __init__(self) -> None:
        self.buffer, self.eof = b"", False
        self.stage, self.fraction = "starting", 0.0
        self._pending: list[bytes] = []

    def feed(self, chunk: bytes | None) -> None:
        if chunk is None:
            self.eof = True
            chunk = b"\n"
        *complete, self.buffer = (self.buffer + chunk).split(b"\n")
        self.buffer = self.buffer[-65536:]
        self._pending.extend(complete)

    def progress(self) -> list[tuple[str, float]]:
        parsed = [p for p in map(_progress_line, self._pending) if p is not None]
        self._pending.clear()
        if parsed:
            self.stage, self.fraction = parsed[-1]
        return parsed


def _read(fd: int) -> bytes | None:
    """What is there to read; None at end of file."""
    try:
        data = os.read(fd, 65536)
    except BlockingIOError:
        return b""
    return data or None


def _progress_line(line: bytes) -> tuple[str, float] | None:
    if not line.strip():
        return None
    try:
        data = json.loads(line)
        return str(data["stage"])[:32], float(data["progress"])
    except (ValueError, KeyError, TypeError):
        logger.debug("ignored a line from the sandbox: %r", line[:200])
        return None


def _kill(proc: subprocess.Popen) -> None:
    # The child leads its own group (start_new_session): the group id is its pid, kept
    # while any member lives even once the child itself has exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:  # unkillable (stuck in the kernel): leave it
        logger.error("sandbox process %d did not die after SIGKILL", proc.pid)
