"""The sandbox's own side: ``sandbox_main(kind)`` is the body of every entry point.

In this order, before the work imports anything big:

1. the limits the request names: address space (RLIMIT_AS, ``memory_limit_mb``), CPU
   seconds (RLIMIT_CPU, ``cpu_limit_s`` where given), the size of any file it writes
   (RLIMIT_FSIZE, ``file_size_limit_mb``), no core files, the kind's niceness; then,
   when the request names an ``identity`` (the parent is root), a network namespace of
   its own (unless ``isolate_network`` is false), at most ``process_limit`` processes of
   that user (RLIMIT_NPROC) and the drop to that user for good (``_identity``);
2. a thread that exits the sandbox (``EXIT_ORPHANED``) once the process that started it
   (``parent_pid``) is gone, so a ``kill -9`` of the worker or the API leaves no orphan;
3. stdout kept for progress lines, and fd 1 (C libraries, ``print``) sent to stderr, the
   log the parent keeps.

Then the kind's work: its result goes to the result file (exit 0), any failure to the
error file as the kind describes it (``EXIT_ERROR``). Its umask, session and environment
are set by the parent as it starts it (``run_sandbox``): ``preexec_fn`` is unsafe in a
threaded process, so the limits are set here.
"""

from __future__ import annotations

# Only the standard library: all of this runs before the limits are in place.
import json
import logging
import os
import resource
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from autofusion.app.services.sandbox._identity import drop_to, leave_network
from autofusion.app.services.sandbox._kind import Progress, SandboxKind

__all__ = ["EXIT_ERROR", "EXIT_ORPHANED", "sandbox_main"]

EXIT_ERROR = 3  # the error file is written
EXIT_ORPHANED = 70  # the parent (worker or API) is gone
_EXIT_USAGE = 2
_WATCH_STACK_BYTES = 256 * 1024  # address space is what the limit counts


def sandbox_main(kind: SandboxKind, argv: list[str] | None = None) -> int:
    """Run ``kind``'s work in the folder named on the command line; the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write(f"usage: python -m {kind.module} FOLDER\n")
        return _EXIT_USAGE
    folder = Path(argv[0])
    error_file = folder / kind.error_file
    # The error file's folder first: a failure to read the request is written there too.
    error_file.parent.mkdir(exist_ok=True)
    try:
        request = json.loads((folder / kind.request_file).read_text(encoding="utf-8"))
        _limit(request, kind.niceness, made=error_file.parent)
        _exit_with_parent(int(request["parent_pid"]))
        result = kind.work(folder, request, _progress(_progress_stream()))
    except BaseException as exc:  # every failure becomes the error file, then an exit code
        error = kind.describe(exc)
        _log_failure(str(error.get("kind")), exc)
        _write_json(error_file, error)
        return EXIT_ERROR
    if result is not None:
        _write_json(folder / kind.result_file, result)
    return 0


def _limit(request: dict[str, Any], niceness: int, made: Path) -> None:
    memory = int(request["memory_limit_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    if request.get("cpu_limit_s") is not None:
        cpu_s = int(request["cpu_limit_s"])
        # SIGXCPU at the soft limit, SIGKILL a second later should it be caught.
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))
    if request.get("file_size_limit_mb") is not None:
        size = int(request["file_size_limit_mb"]) * 1024 * 1024
        # A write past it fails with EFBIG (an error the work reports) instead of the
        # default SIGXFSZ, which would kill the sandbox with nothing said.
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if niceness:
        os.nice(niceness)
    identity = request.get("identity")
    if identity is None:
        return
    if request.get("isolate_network", True):
        why_not = leave_network()
        if why_not is not None:
            logging.getLogger(__name__).warning("sandbox: network not isolated: %s", why_not)
    # Counted per user: the sandbox user's processes and threads, all sandboxes together
    # (a fork bomb stops here); meaningless for the service's own user, so only here.
    processes = int(request.get("process_limit") or 0)
    if processes:
        resource.setrlimit(resource.RLIMIT_NPROC, (processes, processes))
    # ``made`` (the error file's folder) was made before the request was read, as root.
    os.chown(made, identity["uid"], identity["gid"])
    drop_to(identity)


def _exit_with_parent(parent_pid: int) -> None:
    """Exit (``EXIT_ORPHANED``) as soon as ``parent_pid`` is no longer the parent."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(EXIT_ORPHANED)

    threading.stack_size(_WATCH_STACK_BYTES)
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def _progress_stream() -> TextIO:
    """Keep the real stdout for progress; send fd 1 (C libraries, print) to stderr."""
    stream = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return stream


def _progress(stream: TextIO) -> Progress:
    def emit(stage: str, fraction: float) -> None:
        stream.write(json.dumps({"stage": stage, "progress": fraction}) + "\n")

    return emit


def _log_failure(kind: str, exc: BaseException) -> None:
    try:
        logging.getLogger(__name__).error("sandbox: failed (%s)", kind, exc_info=exc)
    except BaseException:  # out of memory even for that: the bare traceback
        traceback.print_exc()


def _write_json(path: Path, data: Any) -> None:
    """``data`` as JSON at ``path``, whole or not at all (the parent may read it any time)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, path)
