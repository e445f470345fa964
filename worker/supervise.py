"""The worker's side of a job's sandbox: ``run_child`` runs ``worker.sandbox`` on an
attempt's folder and reports its progress, and a heartbeat, so that the job's lease is
renewed even while the sandbox is silent.

Starting it, its limits, its progress lines and its end are ``app.services.sandbox``'s
(``run_sandbox``), the one implementation the API's sandbox shares; what the outcome
means for the job (a failed job, a crash that costs an attempt) is ``worker.execute``'s.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from autofusion.app.services.sandbox import Report, SandboxIdentity, SandboxRun, run_sandbox
from autofusion.worker.sandbox import OPTIMIZE

__all__ = ["ChildRun", "run_child"]

# How the sandbox ended (status, returncode, seconds, log tail, its error file and
# ``failure``): exited, timeout, abandoned (report() said so), stopped (the worker stops).
ChildRun = SandboxRun


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
    ``identity``, the sandbox drops to that user (the job file says so too)."""
    return run_sandbox(
        OPTIMIZE,
        folder,
        time_limit_s=time_limit_s,
        heartbeat_s=heartbeat_s,
        report=report,
        should_stop=should_stop,
        identity=identity,
    )
