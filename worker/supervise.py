"""The worker's side of a job's sandbox: ``run_child`` runs ``worker.sandbox`` on an
attempt's folder and reports its progress, and a heartbeat, so that the job's lease is
renewed even while the sandbox is silent.

Starting it, its limits, its progress lines and its end are ``app.services.sandbox``'s
(``run_sandbox``), the one implementation the API's sandbox shares; what the outcome
means for the job (a failed job, a crash that costs an attempt) is ``worker.execute``'s.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

from autofusion.app.core import tracing
from autofusion.app.services.sandbox import Report, SandboxIdentity, SandboxRun, run_sandbox
from autofusion.worker.sandbox import OPTIMIZE, OUTPUT_DIR, PHASES_END, PHASES_FILE

__all__ = ["ChildRun", "phase_times", "run_child"]

# How the sandbox ended (status, returncode, seconds, log tail, its error file and
# ``failure``): exited, timeout, abandoned (report() said so), stopped (the worker stops).
ChildRun = SandboxRun

_MAX_PHASES = 256  # a job has about ten; measured selection repeats some
_PHASE_NAME = re.compile(r"[a-z_]{1,32}")


def run_child(
    folder: Path,
    *,
    time_limit_s: float,
    heartbeat_s: float,
    report: Report,
    should_stop: Callable[[], bool] = lambda: False,
    identity: SandboxIdentity | None = None,
) -> ChildRun:
    """Run ``python -P -m autofusion.worker.sandbox folder`` until it exits or must be
    killed: past ``time_limit_s``, when ``report`` (called with each progress line and
    at least every ``heartbeat_s``) returns False, or once ``should_stop()``. With an
    ``identity``, the sandbox drops to that user (the job file says so too).

    Traced, it is the ``autofusion.sandbox`` span, and the phases the sandbox wrote
    (``output/phases.jsonl``) become its children, ``autofusion.sandbox.<phase>``."""
    with tracing.span("autofusion.sandbox"):
        child = run_sandbox(
            OPTIMIZE,
            folder,
            time_limit_s=time_limit_s,
            heartbeat_s=heartbeat_s,
            report=report,
            should_stop=should_stop,
            identity=identity,
        )
        ended_ns = time.time_ns()
        tracing.annotate(status=child.status, returncode=child.returncode)
        if tracing.enabled():
            for name, start_ns, end_ns in phase_times(folder / OUTPUT_DIR / PHASES_FILE, ended_ns):
                tracing.record_span(f"autofusion.sandbox.{name}", start_ns, end_ns)
    return child


def phase_times(path: Path, ended_ns: int) -> list[tuple[str, int, int]]:
    """(phase, start, end) in ns from the sandbox's phase file: each phase ends where the
    next begins, the last at the end line or, when the sandbox died first, ``ended_ns``.
    The sandbox ran a model a user sent, so the file is read as untrusted: at most
    ``_MAX_PHASES`` lines, names of a safe alphabet, times in order and not after
    ``ended_ns``; anything else ends the list."""
    try:
        with path.open(encoding="utf-8") as f:
            lines = [line for _, line in zip(range(_MAX_PHASES + 1), f, strict=False)]
    except (OSError, UnicodeDecodeError):
        return []
    begun: list[tuple[str, int]] = []
    for line in lines:
        try:
            entry = json.loads(line)
            name, at_ns = str(entry["phase"]), int(entry["at_ns"])
        except (ValueError, TypeError, KeyError):
            break
        if not _PHASE_NAME.fullmatch(name) or at_ns > ended_ns:
            break
        if begun and at_ns < begun[-1][1]:
            break
        begun.append((name, at_ns))
    if not begun:
        return []
    ends = [at for _, at in begun[1:]] + [ended_ns]
    return [
        (name, start, end)
        for (name, start), end in zip(begun, ends, strict=True)
        if name != PHASES_END
    ]
