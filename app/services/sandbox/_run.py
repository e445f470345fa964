"""The parent's side: ``run_sandbox`` starts a sandbox and watches it until it ends.

The sandbox is ``python -P -m MODULE FOLDER`` (``-P``: its working directory holds the
user's files, a data file may well be called ``json.py``, and must not go on
``sys.path``). It runs in a session of its own, so a Ctrl-C or SIGTERM meant for the
parent does not reach it, and its end (done, out of time, abandoned) kills its whole
process group: nothing it started outlives it. It starts with the allow-listed
environment (``HOME`` is its folder) and umask 077, so what it writes is readable by the
service's user only; it sets its own limits first thing (``sandbox_main``).

While it runs, the parent holds it to its wall clock and hears its progress lines and a
heartbeat (``report``), which lets a worker renew its lease while the sandbox is silent.
How it ended is a ``SandboxRun``, whose ``failure`` names what went wrong in the one
vocabulary both parents map to their own answers.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import selectors
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from autofusion.app.services.sandbox._environment import SANDBOX_UMASK, sandbox_environment
from autofusion.app.services.sandbox._identity import SandboxIdentity, grant
from autofusion.app.services.sandbox._kind import SandboxKind
from autofusion.app.services.sandbox._memory import says_out_of_memory

__all__ = ["Failure", "Report", "SandboxRun", "run_sandbox"]

logger = logging.getLogger(__name__)

# Called with (stage, progress) for each progress line and on each heartbeat; returning
# False abandons the run (the job was cancelled or is no longer ours).
Report = Callable[[str, float], bool]
Status = Literal["exited", "timeout", "abandoned", "stopped"]
# time: killed at the wall clock. memory: out of its address space. cpu: out of its CPU
# seconds. signal: killed by another signal (a crash). exit: exited without a result or
# an error file. error: it wrote its error file (``SandboxRun.error`` says what).
Failure = Literal["time", "memory", "cpu", "signal", "exit", "error"]
_LOG_TAIL_BYTES = 4000
_POLL_S = 0.25
_KILL_WAIT_S = 10


@dataclass(frozen=True)
class SandboxRun:
    """How one run ended. ``status``: exited (look at the rest), timeout (killed at the
    limit), abandoned (killed because ``report`` said so), stopped (killed because the
    parent stops). ``error`` is the error file, ``finished`` says the result file is
    there."""

    status: Status
    returncode: int | None
    seconds: float
    log_tail: str
    error: dict[str, Any] | None = None
    finished: bool = False
    # CPU seconds it used (user + system, its reaped children included): a run killed at
    # its wall clock that computed all along would do the same again; one that waited
    # (a busy machine, a stall) might not.
    cpu_seconds: float = 0.0
    # Seconds its threads were ready to run but waited for a CPU (a loaded machine).
    runnable_seconds: float = 0.0

    @property
    def busy(self) -> bool:
        """It computed, or wanted to, for at least half of its wall clock."""
        return self.cpu_seconds + self.runnable_seconds >= 0.5 * self.seconds

    @property
    def failure(self) -> Failure | None:
        """What went wrong; None when it finished, was abandoned or was stopped."""
        if self.status == "timeout":
            return "time"
        if self.status != "exited":
            return None
        if self.error is not None:
            return "memory" if self.error.get("kind") == "memory" else "error"
        if self.returncode == 0 and self.finished:
            return None
        # It died before it could write its error file (an allocation failing in C++
        # code, in the interpreter itself): its log says why.
        if says_out_of_memory(self.log_tail):
            return "memory"
        if self.returncode == -signal.SIGXCPU:
            return "cpu"
        return "signal" if (self.returncode or 0) < 0 else "exit"


def run_sandbox(
    kind: SandboxKind,
    folder: Path,
    *,
    time_limit_s: float,
    heartbeat_s: float = math.inf,
    report: Report = lambda stage, progress: True,
    should_stop: Callable[[], bool] = lambda: False,
    identity: SandboxIdentity | None = None,
) -> SandboxRun:
    """Run ``kind`` on ``folder`` (its request already written) until it exits or must be
    killed: past ``time_limit_s``, when ``report`` returns False, or once ``should_stop()``.
    With an ``identity`` (the request names it too), ``folder`` becomes that user's."""
    start = time.monotonic()
    (folder / kind.work_dir).mkdir(parents=True, exist_ok=True)
    grant(folder, identity)
    with open(folder / kind.log_file, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-P", "-m", kind.module, str(folder)],
            cwd=folder / kind.work_dir,
            env=sandbox_environment(folder, keep=kind.keep_env),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            start_new_session=True,
            umask=SANDBOX_UMASK,
        )
    try:
        status = _watch(proc, start + time_limit_s, heartbeat_s, report, should_stop)
    finally:
        runnable_seconds = _runnable_seconds(proc.pid)
        cpu_seconds = _kill(proc)  # the group too: whatever the sandbox started goes with it
        proc.stdout.close()
        _drop_links(folder)
    return SandboxRun(
        status,
        proc.returncode,
        time.monotonic() - start,
        _log_tail(folder / kind.log_file, _LOG_TAIL_BYTES),
        error=_read_json(folder / kind.error_file),
        finished=(folder / kind.result_file).is_file(),
        cpu_seconds=cpu_seconds,
        runnable_seconds=runnable_seconds,
    )


def _watch(
    proc: subprocess.Popen,
    deadline: float,
    heartbeat_s: float,
    report: Report,
    should_stop: Callable[[], bool],
) -> Status:
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
            ready = not lines.eof and selector.select(timeout=min(_POLL_S, deadline - now))
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
            if (lines.eof or not ready) and _exited(proc):
                return "exited"
            if lines.eof:
                time.sleep(0.05)  # stdout is closed: the process is on its way out
    finally:
        selector.close()


class _Lines:
    """Splits the sandbox's stdout into progress records; ignores anything else."""

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


def _kill(proc: subprocess.Popen) -> float:
    """Kill the sandbox's group and reap it; the CPU seconds it used."""
    # The sandbox leads its own group (start_new_session): the group id is its pid, kept
    # while any member lives even once the sandbox itself has exited.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    deadline = time.monotonic() + _KILL_WAIT_S
    while proc.returncode is None:
        try:  # wait4, not Popen.wait: its resource usage is the point
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: its usage is lost
            break
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)
            return usage.ru_utime + usage.ru_stime
        if time.monotonic() >= deadline:  # unkillable (stuck in the kernel): leave it
            logger.error("sandbox process %d did not die after SIGKILL", proc.pid)
            break
        time.sleep(0.02)
    return 0.0


def _runnable_seconds(pid: int) -> float:
    """How long the threads of ``pid`` waited on a run queue (``/proc/PID/task/*/schedstat``,
    its second field, in ns); 0 where the kernel does not say."""
    total = 0
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            path = f"/proc/{pid}/task/{task}/schedstat"
            with contextlib.suppress(OSError, ValueError, IndexError), open(path) as f:
                total += int(f.read().split()[1])
    return total / 1e9


def _exited(proc: subprocess.Popen) -> bool:
    """Whether the sandbox has exited, leaving it to be reaped by ``_kill`` (which reads
    its resource usage then): ``waitid`` with WNOWAIT, where Popen.poll would reap it."""
    try:
        found = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return found is not None


def _log_tail(path: Path, size: int) -> str:
    """The last ``size`` bytes of a sandbox's log, as text ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _drop_links(folder: Path) -> None:
    """Remove from the sandbox's folder whatever is not a plain file or folder: a symlink
    (or a hard link) that a subverted sandbox left as ``output/report.json`` would
    otherwise make the worker or the API read, and store for the tenant to download, a
    file only they can read. Our own sandbox writes none, so nothing of its is lost."""
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            path = os.path.join(root, name)
            try:
                info = os.lstat(path)
                plain_dir = stat.S_ISDIR(info.st_mode)
                plain_file = stat.S_ISREG(info.st_mode) and info.st_nlink == 1
                if not (plain_dir or plain_file):
                    os.unlink(path)
                    logger.warning("sandbox: removed %s, which is not a plain file", path)
            except FileNotFoundError:  # gone already
                continue


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
