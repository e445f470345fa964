"""How an attempt ended, for ``worker.execute``: the errors that end it, and the rule
that makes a crash poison.

A ``Crash`` with an ``outcome`` (``signal:N``, ``timeout``, ``memory``) is one the model
itself brings about: onnx, onnxruntime or the optimizer dies on it, or it needs more
time or memory than the worker gives, every time. Seen a second time on the same model
digest (``Job.attempt_log``), the job fails instead of costing a third attempt, typed
by what happened: ``crashed-twice`` for a signal, ``time-limit`` (``profile-time-limit``
when profiling ran out of it) or ``memory-limit`` for a limit, which is no crash.
Crashes that say nothing about the model (the artifact store, a bug in the worker, a
worker killed from outside: ``lost``) cost attempts as before.
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = [
    "KIND_PROBLEMS",
    "Crash",
    "UserError",
    "PROFILE_TIME_LIMIT_ADVICE",
    "TIME_LIMIT_ADVICE",
    "crashed_twice_message",
    "hung_message",
    "profile_unfinished_message",
    "repeated_problem",
    "same_crash_before",
    "signal_name",
]


class UserError(Exception):
    """The job cannot succeed as asked: fail it now, with this message and problem."""

    def __init__(self, message: str, problem: str = "invalid-model") -> None:
        super().__init__(message)
        self.problem = problem


class Crash(Exception):
    """The attempt died; another attempt might not. ``outcome`` names a deterministic
    end (``signal:11``, ``timeout``, ``memory``) that a second attempt on the same model
    would likely meet again; None for one that says nothing about the model (the store
    or the worker failed)."""

    def __init__(self, message: str, outcome: str | None = None, problem: str = "crashed") -> None:
        super().__init__(message)
        self.outcome, self.problem = outcome, problem


# The sandbox's error kinds that fail the job at once, as problem slugs.
KIND_PROBLEMS = {
    "model": "invalid-model",
    "config": "invalid-config",
    "pattern": "invalid-pattern",
}


def same_crash_before(
    log: list[dict[str, Any]] | None, outcome: str | None, digest: str
) -> int | None:
    """The earlier attempt in ``log`` (``Job.attempt_log``) that ended as ``outcome`` on
    the model ``digest``, if any; None for an outcome that is not deterministic."""
    if outcome is None:
        return None
    for entry in log or []:
        if entry.get("model_digest") == digest and entry.get("outcome") == outcome:
            return int(entry.get("attempt") or 0)
    return None


TIME_LIMIT_ADVICE = (
    "raise the worker's time limit (AUTOFUSION_JOB_TIME_LIMIT_S), or make the job "
    'lighter: fewer patterns (the config\'s "exclude" list), selection "priority" '
    "rather than measured, no profile"
)


# Profiling is the one phase a job can do without: its time is the model's run time.
PROFILE_TIME_LIMIT_ADVICE = (
    "raise the worker's time limit (job_time_limit_s, AUTOFUSION_JOB_TIME_LIMIT_S), or "
    'turn profiling off (submit without --profile, or "profile": false in the config)'
)


def _advice(stage: str) -> str:
    return PROFILE_TIME_LIMIT_ADVICE if stage == "profiling" else TIME_LIMIT_ADVICE


def hung_message(limit_s: int, cpu_s: float, seconds: float, stage: str) -> str:
    """Why a job that computed until its time limit is not tried again."""
    return (
        f"the optimization ran past the time limit of {limit_s} s (stage {stage}), computing "
        f"all along ({cpu_s:.0f} CPU seconds in {seconds:.0f} s): another attempt would do "
        f"the same, so it is not tried again; {_advice(stage)}"
    )


def profile_unfinished_message(limit_s: int, *, checked: bool) -> str:
    """What a job whose profiling ran out of time says: its model is kept, no speed."""
    model = "passed its check and is kept" if checked else "is kept (its check was skipped)"
    return (
        f"Profiling did not finish within the time limit of {limit_s} s: the fused model "
        f"{model}, its speed is unknown; {PROFILE_TIME_LIMIT_ADVICE}"
    )


def repeated_problem(outcome: str | None, problem: str) -> str:
    """The problem type of a job ended by the same outcome twice: a signal is a crash, a
    time or memory limit keeps its own type (a limit is not a crash)."""
    return "crashed-twice" if outcome is None or outcome.startswith("signal:") else problem


def crashed_twice_message(
    what: str, earlier: int, attempt: int, stage: str, outcome: str | None
) -> str:
    """Why a job stops after its second identical crash, and what to try instead."""
    if outcome == "timeout":
        advice = _advice(stage)
    elif outcome == "memory":
        advice = (
            "raise the worker's memory limit (AUTOFUSION_JOB_MEMORY_LIMIT_MB), or fold fewer "
            'constants ("fold_constants": false or a lower "fold_output_size_limit") and '
            "leave out profiling"
        )
    else:
        advice = (
            "report it with the model (it crashes onnx, onnxruntime or the optimizer); "
            'meanwhile try leaving patterns out (the config\'s "exclude" list, a --strategy '
            'file for autofusion submit) or the check ("check": {"enabled": false}) to find '
            "which step crashes"
        )
    return (
        f"{what}, the same way on attempts {earlier} and {attempt} (stage {stage}): this "
        f"model fails like this every time, so it is not tried again; {advice}"
    )


def signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
