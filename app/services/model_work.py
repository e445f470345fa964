"""Model work the API hands to its sandbox: upload checks and pattern trials.

``run_model_child`` runs ``app.services.api_sandbox`` (``app.services.sandbox``'s
``run_sandbox``, in a thread of its own: the event loop never blocks on it) and holds it
to the ``api_sandbox_*`` settings:

* ``api_sandbox_memory_limit_mb``: the sandbox's address space (RLIMIT_AS);
* ``api_sandbox_cpu_limit_s``: its CPU seconds (RLIMIT_CPU), should the wall clock fail;
* ``api_sandbox_time_limit_s``: wall clock, after which its whole process group is
  killed (it runs in a session of its own);
* ``api_sandbox_concurrency``: sandboxes at once in this process (upload checks and
  trials together); a request waits up to
  ``api_sandbox_queue_s`` for a free slot, then answers 503 with ``Retry-After``.

A limit it runs into is a 422 problem that names the limit and its setting, never a
500; a refusal it makes (``model_checks``' problems) reaches the client as is.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import json
import logging
import os
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

from autofusion.app.core import tracing
from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.services.api_sandbox import MODEL_WORK
from autofusion.app.services.sandbox import SandboxIdentity, SandboxRun, run_sandbox, share_read
from autofusion.app.services.sandbox_policy import isolation_request, sandbox_identity

__all__ = ["child_settings", "inspect_upload", "run_model_child"]

logger = logging.getLogger(__name__)

# Whether the client that asked for the work has left.
ClientCheck = Callable[[], Awaitable[bool]]

_SLOT_POLL_S = 0.05
# How often a running sandbox asks whether its client is still there.
_GONE_POLL_S = 0.5
# A cancelled request stops its sandbox within a poll; the kill waits this long at most.
_STOP_WAIT_S = 15
# Settings a sandbox never needs and must not see: connection strings carry passwords.
_SECRET_WORDS = ("url", "secret", "password", "token", "key", "credential")
_LIMIT_SETTINGS = {
    "time": "api_sandbox_time_limit_s",
    "cpu": "api_sandbox_cpu_limit_s",
    "memory": "api_sandbox_memory_limit_mb",
}


class _Slots:
    """How many sandboxes run in this process, in all, per owner (a tenant, or an
    anonymous client's address) and for trials; shared by every app in it. Without the
    last two, hostile tenants' trials and big uploads held every slot and a normal
    upload's check answered 503."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.running = 0
        self.trials = 0
        self.by_owner: Counter[str] = Counter()

    def try_take(self, settings: Settings, owner: str | None, trial: bool) -> str | None:
        """Take a slot: None, or the setting whose limit is reached."""
        with self._lock:
            if self.running >= settings.api_sandbox_concurrency:
                return "api_sandbox_concurrency"
            if trial and self.trials >= max(1, settings.api_sandbox_concurrency // 2):
                return "api_sandbox_concurrency (half of it for trials)"
            if owner is not None and self.by_owner[owner] >= settings.api_sandbox_per_tenant:
                return "api_sandbox_per_tenant"
            self.running += 1
            self.trials += trial
            if owner is not None:
                self.by_owner[owner] += 1
            return None

    def give_back(self, owner: str | None, trial: bool) -> None:
        with self._lock:
            self.running -= 1
            self.trials -= trial
            if owner is not None:
                self.by_owner[owner] -= 1
                if self.by_owner[owner] <= 0:
                    del self.by_owner[owner]


_slots = _Slots()


def child_settings(settings: Settings) -> dict[str, Any]:
    """The settings a sandbox checks a model against, without anything secret."""
    data = settings.model_dump(mode="json")
    data["data_dir"] = str(settings.data_dir.resolve())
    return {k: v for k, v in data.items() if not any(w in k for w in _SECRET_WORDS)}


async def inspect_upload(
    model_path: Path, data_names: Collection[str], settings: Settings, *, owner: str | None = None
) -> None:
    """``model_checks.inspect_model`` on an upload, in a sandbox whatever its size.

    Parsing a ModelProto takes a few times its size in memory, and a small file can
    hold a million nodes: the API process parses none (eight 26 MB uploads at once took
    it from 253 MB to 5.5 GB when small models were checked in its threads). The cost is
    a sandbox's start, about a second, on each upload. ``owner``: whose sandbox slots it
    takes (``run_model_child``).
    """
    request = {"model": str(model_path.resolve()), "data_names": sorted(data_names)}
    await run_model_child("inspect", request, settings, what="the model check", owner=owner)


async def run_model_child(
    task: str,
    request: dict[str, Any],
    settings: Settings,
    *,
    what: str,
    client_gone: ClientCheck | None = None,
    owner: str | None = None,
) -> dict[str, Any]:
    """Run ``task`` in a sandbox; its result, or the ProblemError that says why not.

    ``what`` names the work in messages ("the pattern trial", "the model check");
    ``client_gone`` is asked every ``_GONE_POLL_S``: once the client has left, the
    sandbox is killed (its slot is free for someone who waits for an answer); ``owner``
    holds at most ``api_sandbox_per_tenant`` slots, and trials at most half of them.
    """
    trial = task == "trial"
    await _take_slot(settings, what, owner, trial)
    try:
        folder = Path(tempfile.mkdtemp(prefix="sandbox-", dir=_scratch_root(settings)))
        try:
            with tracing.span("autofusion.api_sandbox", task=task):  # the request's own
                return await _run_in(folder, task, request, settings, what, client_gone)
        finally:
            await asyncio.to_thread(shutil.rmtree, folder, True)
    finally:
        _slots.give_back(owner, trial)


def _scratch_root(settings: Settings) -> Path:
    root = settings.uploads_dir
    root.mkdir(parents=True, exist_ok=True)
    return root


async def _take_slot(settings: Settings, what: str, owner: str | None, trial: bool) -> None:
    deadline = time.monotonic() + settings.api_sandbox_queue_s
    while (limit := _slots.try_take(settings, owner, trial)) is not None:
        if time.monotonic() >= deadline:
            retry = max(1, round(settings.api_sandbox_time_limit_s / 2))
            busy = ProblemError(
                503,
                "sandbox-busy",
                "Too much model work at once",
                f"{_slots.running} model checks or pattern trials are running, the most "
                f"this server runs at once for this request ({limit}), so {what} could "
                f"not start; try again in {retry} s",
                headers={"Retry-After": str(retry)},  # the problem handler sends them
            )
            raise busy
        await asyncio.sleep(_SLOT_POLL_S)


async def _run_in(
    folder: Path,
    task: str,
    request: dict[str, Any],
    settings: Settings,
    what: str,
    client_gone: ClientCheck | None,
) -> dict[str, Any]:
    payload = {
        **request,
        "task": task,
        "memory_limit_mb": settings.api_sandbox_memory_limit_mb,
        "cpu_limit_s": settings.api_sandbox_cpu_limit_s,
        **isolation_request(settings, file_size_limit_mb=settings.api_sandbox_file_size_limit_mb),
        "parent_pid": os.getpid(),
        "settings": child_settings(settings),
    }
    (folder / MODEL_WORK.request_file).write_text(json.dumps(payload), encoding="utf-8")
    identity = sandbox_identity(settings)
    await asyncio.to_thread(_share_upload, Path(request["model"]), identity)
    run = await _watched(folder, settings.api_sandbox_time_limit_s, identity, client_gone)
    if run.failure is None:
        with contextlib.suppress(OSError, ValueError):  # unreadable: it failed, below
            return json.loads((folder / MODEL_WORK.result_file).read_text(encoding="utf-8"))
    if run.failure == "error" and run.error.get("kind") == "problem":
        problem = run.error["problem"]
        raise ProblemError(
            problem["status"],
            problem["slug"],
            problem["title"],
            problem["detail"],
            **problem["extra"],
        )
    logger.warning(
        "%s failed (%s, exit %s, %.1f s): %s",
        what,
        run.failure,
        run.returncode,
        run.seconds,
        run.log_tail,
    )
    if run.failure in _LIMIT_SETTINGS:
        raise _limit_problem(what, run.failure, settings)
    raise _failed_problem(what, run)


def _share_upload(model: Path, identity: SandboxIdentity | None) -> None:
    """The upload's folder (the model and its data files) readable by the sandbox's user,
    never writable: a sandbox sees the one upload it checks."""
    folder = model.parent
    share_read([folder, *(p for p in folder.iterdir() if p.is_file())], identity)


async def _watched(
    folder: Path,
    time_limit_s: float,
    identity: SandboxIdentity | None,
    client_gone: ClientCheck | None,
) -> SandboxRun:
    """``run_sandbox`` in a watcher thread; a cancelled request, or one whose client has
    left, stops the sandbox (its group is killed) before the folder is removed."""
    stop = threading.Event()
    watch = functools.partial(
        run_sandbox,
        MODEL_WORK,
        folder,
        time_limit_s=time_limit_s,
        should_stop=stop.is_set,
        identity=identity,
    )
    running = asyncio.wrap_future(_in_thread(watch))
    try:
        while client_gone is not None:
            done, _ = await asyncio.wait({running}, timeout=_GONE_POLL_S)
            if done:
                break
            if await client_gone():
                stop.set()
                await asyncio.wait([running], timeout=_STOP_WAIT_S)
                raise ProblemError(
                    400,
                    "upload-incomplete",
                    "Upload incomplete",
                    "the client disconnected before the model work ended; it was stopped",
                )
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        stop.set()
        await asyncio.wait([running], timeout=_STOP_WAIT_S)
        raise


def _in_thread(call: Callable[[], SandboxRun]) -> concurrent.futures.Future[SandboxRun]:
    """``call()`` in a thread of its own: a sandbox watched for a minute never holds a
    thread of the pool the event loop's other ``to_thread`` work waits for."""
    future: concurrent.futures.Future[SandboxRun] = concurrent.futures.Future()

    def target() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(call())
        except BaseException as exc:  # the awaiting request sees it
            future.set_exception(exc)

    threading.Thread(target=target, name="sandbox-watch", daemon=True).start()
    return future


def _limit_problem(what: str, kind: str, settings: Settings) -> ProblemError:
    limit = {
        "time": f"{settings.api_sandbox_time_limit_s:g} s",
        "cpu": f"{settings.api_sandbox_cpu_limit_s} s of CPU",
        "memory": f"{settings.api_sandbox_memory_limit_mb} MB",
    }[kind]
    return ProblemError(
        422,
        "model-work-limit",
        "The model needs more than the server allows",
        f"{what} ran out of its {limit}: the model is too big or hostile. Simplify or "
        f"split the model, or ask the operator to raise {_LIMIT_SETTINGS[kind]}",
        limit=kind,
    )


def _failed_problem(what: str, run: SandboxRun) -> ProblemError:
    returncode = run.returncode or 0
    internal = (run.error or {}).get("message")
    if run.failure == "signal":
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
