"""What every sandboxed child process shares: the environment and file mode it starts
with, how it leaves when its parent dies, and how its parent reads the end of its log.

Both kinds of child use it: the worker's job sandbox (``worker/supervise.py`` starts
``python -m autofusion.worker.sandbox``) and the API's model child
(``app/services/model_sandbox.py`` starts ``python -m autofusion.app.services.model_child``).
A child handles a hostile model, so it gets an allow-list, not the parent's environment
minus a few names: whatever secret a deployment adds later (``DATABASE_URL``,
``REDIS_URL``, ``PGPASSWORD``, ``AWS_*``, any ``AUTOFUSION_*`` setting) stays out
without anyone having to remember it.

Standard library only: the worker imports this before it starts a child, and each
child imports it before its memory limit is in place.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "CHILD_UMASK",
    "CODE_ROOT",
    "EXIT_ORPHANED",
    "exit_with_parent",
    "log_tail",
    "sandbox_environment",
]

# Files a child writes (outputs, scratch, logs) are readable by the service's user only.
CHILD_UMASK = 0o077
# The folder that holds app/, worker/ and fusion_core/: a child must find this code even
# when the service runs from a source checkout rather than an install.
CODE_ROOT = str(Path(__file__).resolve().parents[2])

# Passed through when the parent has them: what a process needs to run, not to log in.
_ALLOWED = frozenset({"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR"})
# Thread-pool sizes of OpenMP, the BLAS libraries and onnxruntime.
_ALLOWED_PREFIXES = ("OMP_", "ORT_")
_THREAD_VARIABLES = frozenset({"MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"})


def sandbox_environment(
    home: Path,
    *,
    keep: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The allow-listed environment of a child whose own folder is ``home``.

    ``keep`` names further variables to pass through (the worker's test-only crash
    hook); ``environ`` is the parent's environment (``os.environ`` by default).
    """
    source = os.environ if environ is None else environ
    allowed = _ALLOWED | _THREAD_VARIABLES | set(keep)
    env = {
        key: value
        for key, value in source.items()
        if key in allowed or key.startswith(_ALLOWED_PREFIXES)
    }
    env["HOME"] = os.path.abspath(home)
    # One BLAS thread: less memory reserved per child, and onnxruntime has its own pool.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [CODE_ROOT, source.get("PYTHONPATH")]))
    return env


EXIT_ORPHANED = 70  # a child's exit status when its parent (worker or API) is gone


def exit_with_parent(parent_pid: int) -> None:
    """Exit the child (``EXIT_ORPHANED``) as soon as ``parent_pid`` is no longer its
    parent, so that a ``kill -9`` of the worker or the API leaves no orphan behind."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(EXIT_ORPHANED)

    threading.stack_size(256 * 1024)  # address space is what the child's limit counts
    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def log_tail(path: Path, size: int) -> str:
    """The last ``size`` bytes of a child's log, as text ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""
