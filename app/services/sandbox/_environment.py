"""The environment and file mode a sandbox starts with.

A sandbox handles a hostile model, so it gets an allow-list, not the parent's environment
minus a few names: whatever secret a deployment adds later (``DATABASE_URL``,
``REDIS_URL``, ``PGPASSWORD``, ``AWS_*``, any ``AUTOFUSION_*`` setting) stays out
without anyone having to remember it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = ["SANDBOX_UMASK", "CODE_ROOT", "sandbox_environment"]

# Files a sandbox writes (outputs, scratch, logs) are readable by the service's user only.
SANDBOX_UMASK = 0o077
# The folder that holds app/, worker/ and fusion_core/: a sandbox must find this code even
# when the service runs from a source checkout rather than an install.
CODE_ROOT = str(Path(__file__).resolve().parents[3])

# Passed through when the parent has them: what a process needs to run, not to log in.
_ALLOWED = frozenset({"PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ"})
# Thread-pool sizes of OpenMP, the BLAS libraries and onnxruntime.
_ALLOWED_PREFIXES = ("OMP_", "ORT_")
_THREAD_VARIABLES = frozenset({"MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS"})


def sandbox_environment(
    home: Path,
    *,
    keep: Iterable[str] = (),
    environ: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The allow-listed environment of a sandbox whose own folder is ``home``.

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
    # Temporary files in its own folder too, never the host's /tmp: sandboxes share one
    # user, so a shared /tmp is where one could read or plant another's files; the files
    # go with the folder when the attempt ends; and the check's copy of a big fused model
    # lands on the data volume, not a container's /tmp (a tmpfs that counts as memory).
    env["TMPDIR"] = env["HOME"]
    # One BLAS thread: less memory reserved per sandbox, and onnxruntime has its own pool.
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [CODE_ROOT, source.get("PYTHONPATH")]))
    return env
