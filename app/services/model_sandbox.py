"""Model work the API hands to a child process: upload checks and pattern trials.

``run_model_child`` starts ``python -P -m app.services.model_child FOLDER`` with
asyncio's subprocess API (the event loop never blocks on it) and holds it to the
``api_sandbox_*`` settings:

* ``api_sandbox_memory_limit_mb``: the child's address space (RLIMIT_AS);
* ``api_sandbox_cpu_limit_s``: its CPU seconds (RLIMIT_CPU), should the wall clock fail;
* ``api_sandbox_time_limit_s``: wall clock, after which its whole process group is
  killed (it runs in a session of its own);
* ``api_sandbox_concurrency``: children at once in this process; a request waits up to
  ``api_sandbox_queue_s`` for a free slot, then answers 503 with ``Retry-After``.

The child starts with an allow-listed environment (``sandbox_env``: no credentials) and
sets umask 077 itself, first thing. A limit it runs into is a 422 problem that names the
limit and its setting, never a 500; a refusal it makes (``model_checks``' problems)
reaches the client as is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from collections.abc import Collection
from pathlib import Path
from typing import Any

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.services.model_checks import inspect_model
from autofusion.app.services.model_child import ERROR_FILE, MEMORY_HINTS, REQUEST_FILE, RESULT_FILE
from autofusion.app.services.sandbox_env import log_tail, sandbox_environment

__all__ = ["child_settings", "inspect_upload", "run_model_child"]

logger = logging.getLogger(__name__)

LOG_FILE = "child.log"
_SLOT_POLL_S = 0.05
# Settings a child never needs and must not see: connection strings carry passwords.
_SECRET_WORDS = ("url", "secret", "password", "token", "key", "credential")


class _Slots:
    """How many children run in this process; shared by every app in it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0

    def try_take(self, capacity: int) -> bool:
        with self._lock:
            if self.running >= capacity:
                return False
            self.running += 1
            return True

    def give_back(self) -> None:
        with self._lock:
            self.running -= 1


_slots = _Slots()


def child_settings(settings: Settings) -> dict[str, Any]:
    """The settings a child checks a model against, without anything secret."""
    data = settings.model_dump(mode="json")
    data["data_dir"] = str(settings.data_dir.resolve())
    return {k: v for k, v in data.items() if not any(w in k for w in _SECRET_WORDS)}


async def inspect_upload(model_path: Path, data_names: Collection[str], settings: Settings) -> None:
    """``model_checks.inspect_model`` on an upload, in a child unless the model is small.

    Parsing a ModelProto takes a few times its size in memory: a model up to
    ``api_inline_check_bytes`` is checked in a thread of the API process (no child to
    start), a bigger one in a child under ``api_sandbox_memory_limit_mb``.
    """
    try:
        size = await asyncio.to_thread(lambda: model_path.stat().st_size)
    except OSError:  # no model at all: inspect_model says so
        size = 0
    if size <= settings.api_inline_check_bytes:
        await asyncio.to_thread(inspect_model, model_path, data_names, settings)
        return
    request = {"model": str(model_path.resolve()), "data_names": sorted(data_names)}
    await run_model_child("inspect", request, settings, what="the model check")


async def run_model_child(
    task: str, request: dict[str, Any], settings: Settings, *, what: str
) -> dict[str, Any]:
    """Run ``task`` in a child; its result, or the ProblemError that says why not.

    ``what`` names the work in messages ("the pattern trial", "the model check").
    """
    await _take_slot(settings, what)
    try:
        folder = Path(tempfile.mkdtemp(prefix="model-child-", dir=_scratch_root(settings)))
        try:
            return await _run_in(folder, task, request, settings, what)
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)
    finally:
        _slots.give_back()


def _scratch_root(settings: Settings) -> Path:
    root = settings.uploads_dir
    root.mkdir(parents=True, exist_ok=True)
    return root


async def _take_slot(settings: Settings, what: str) -> None:
    deadline = time.monotonic() + settings.api_sandbox_queue_s
    while not _slots.try_take(settings.api_sandbox_concurrency):
        if time.monotonic() >= deadline:
            retry = max(1, round(settings.api_sandbox_time_limit_s / 2))
            busy = ProblemError(
                503,
                "sandbox-busy",
                "Too much model work at once",
                f"{settings.api_sandbox_concurrency} model checks or pattern trials are "
                f"already running, the most this server runs at once "
                f"(api_sandbox_concurrency), so {what} could not start; try again in "
                f"{retry} s",
            )
            busy.headers = {"Retry-After": str(retry)}  # the problem handler sends them
            raise busy
        await asyncio.sleep(_SLOT_POLL_S)


async def _run_in(
    folder: Path, task: str, request: dict[str, Any], settings: Settings, what: str
) -> dict[str, Any]:
    payload = {
        **request,
        "task": task,
        "memory_limit_mb": settings.api_sandbox_memory_limit_mb,
        "cpu_limit_s": settings.api_sandbox_cpu_limit_s,
        "parent_pid": os.getpid(),
        "settings": child_settings(settings),
    }
    (folder / REQUEST_FILE).write_text(json.dumps(payload), encoding="utf-8")
    start = time.monotonic()
    returncode = await _spawn_and_wait(folder, settings.api_sandbox_time_limit_s)
    seconds = time.monotonic() - start
    if returncode is None:
        logger.warning("%s ran past %.0f s: killed", what, settings.api_sandbox_time_limit_s)
        raise _limit_problem(what, f"{settings.api_sandbox_time_limit_s:g} s", "time")
    result = _read_json(folder / RESULT_FILE)
    if returncode == 0 and result is not None:
        return result
    error = _read_json(folder / ERROR_FILE) or {}
    if "problem" in error:
        problem = error["problem"]
        raise ProblemError(
            problem["status"],
            problem["slug"],
            problem["title"],
            problem["detail"],
            **problem["extra"],
        )
    log = log_tail(folder / LOG_FILE, 2000)
    logger.warning("%s failed (exit %s, %.1f s): %s", what, returncode, seconds, log)
    # A child that died before it could write error.json (an allocation failing in C++
    # code, in the interpreter itself) says why on stderr.
    if error.get("memory") or (not error and any(h in log.lower() for h in MEMORY_HINTS)):
        raise _limit_problem(what, f"{settings.api_sandbox_memory_limit_mb} MB", "memory")
    if returncode == -signal.SIGXCPU:
        raise _limit_problem(what, f"{settings.api_sandbox_cpu_limit_s} s of CPU", "cpu")
    raise _failed_problem(what, returncode, error.get("internal"))


async def _spawn_and_wait(folder: Path, time_limit_s: float) -> int | None:
    """The child's exit status, or None when it ran out of time (its group is killed)."""
    with open(folder / LOG_FILE, "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            # -P: nothing of the working directory goes on sys.path.
            sys.executable,
            "-P",
            "-m",
            "autofusion.app.services.model_child",
            str(folder),
            cwd=folder,
            env=sandbox_environment(folder),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    try:
        return await asyncio.wait_for(proc.wait(), time_limit_s)
    except TimeoutError:
        return None
    finally:
        # Whatever happened (done, timed out, the request cancelled), nothing it
        # started survives it.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        if proc.returncode is None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(proc.wait()), 10)


def _limit_problem(what: str, limit: str, kind: str) -> ProblemError:
    setting = {
        "time": "api_sandbox_time_limit_s",
        "cpu": "api_sandbox_cpu_limit_s",
        "memory": "api_sandbox_memory_limit_mb",
    }[kind]
    return ProblemError(
        422,
        "model-work-limit",
        "The model needs more than the server allows",
        f"{what} ran out of its {limit}: the model is too big or hostile. Simplify or "
        f"split the model, or ask the operator to raise {setting}",
        limit=kind,
    )


def _failed_problem(what: str, returncode: int, internal: str | None) -> ProblemError:
    if returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.valid_signals() else ""
        cause = f"crashed ({name or f'signal {-returncode}'})"
    else:
        cause = f"failed ({internal})" if internal else f"failed (exit status {returncode})"
    return ProblemError(
        422,
        "model-work-failed",
        "The model could not be processed",
        f"{what} {cause} on this model: it is likely malformed or hostile. Check that "
        "onnx.checker.check_model accepts it, or export it again",
    )


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
