"""The exit codes of every ``autofusion`` command: one table, stable for scripts.

Each command returns one of these (``docs/service.md``, "Exit codes", and the README show
this table; ``autofusion --help`` prints it). A code means the same in every command:
3 is a bad model whether ``optimize`` read it or ``submit``'s server refused it.
"""

from __future__ import annotations

import textwrap

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_CONFLICT",
    "EXIT_GATE_FAILED",
    "EXIT_INTERNAL",
    "EXIT_INTERRUPTED",
    "EXIT_JOB_FAILED",
    "EXIT_OK",
    "EXIT_QUOTA",
    "EXIT_SERVER",
    "EXIT_TIMEOUT",
    "EXIT_USAGE",
    "TABLE",
    "epilog",
    "for_http_status",
    "for_job_problem",
    "table_text",
]

EXIT_OK = 0
EXIT_GATE_FAILED = 1
EXIT_USAGE = 2
EXIT_BAD_INPUT = 3
EXIT_JOB_FAILED = 4
EXIT_SERVER = 5
EXIT_TIMEOUT = 6
EXIT_CONFLICT = 7
EXIT_INTERNAL = 8  # a bug of ours: one line, the traceback only with AUTOFUSION_DEBUG=1
EXIT_QUOTA = 9  # the tenant's quota: wait, or delete jobs (not a server error to page on)
EXIT_INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT

# (code, name, meaning): what --help prints and the documentation repeats.
TABLE: tuple[tuple[int, str, str], ...] = (
    (
        EXIT_OK,
        "ok",
        "success (optimize: the model written passed the check, after a fallback if one "
        "was needed; submit: every gate passed)",
    ),
    (
        EXIT_GATE_FAILED,
        "gate-failed",
        "the result failed a quality gate: the numerical check (optimize --strict, or the "
        "server's for submit), --max-abs-diff or --min-speedup",
    ),
    (
        EXIT_USAGE,
        "usage",
        "usage or config error: a bad option, an unknown pattern, target or strategy, an "
        "invalid strategy file, a missing API key, a job or registry entry that does not "
        "exist (HTTP 400/401/403/404)",
    ),
    (
        EXIT_BAD_INPUT,
        "bad-input",
        "the input is wrong: the model is missing, not ONNX, malformed or unsafe, or a "
        "pattern file is invalid (locally, or the server's 413/415/422)",
    ),
    (
        EXIT_JOB_FAILED,
        "job-failed",
        "the server's job failed or was cancelled (a job failed by its check, its model, "
        "its pattern or its config exits 1, 3, 3 or 2, as the same mistake does locally)",
    ),
    (
        EXIT_SERVER,
        "server-error",
        "the server cannot be reached, answered a server error (5xx, 429 after retries), "
        "or is not an autofusion server",
    ),
    (
        EXIT_TIMEOUT,
        "timeout",
        "--timeout ran out before the job finished (the job goes on; its URL is printed)",
    ),
    (
        EXIT_CONFLICT,
        "conflict",
        "the registry entry changed on the server since you read it (412), or already "
        "exists (409): get it again, redo the change, retry",
    ),
    (EXIT_INTERNAL, "internal", "a bug in autofusion (AUTOFUSION_DEBUG=1 shows the traceback)"),
    (
        EXIT_QUOTA,
        "quota",
        "the server refused for this tenant's quota: too many queued jobs (429) or stored "
        "bytes over its limit (507); wait (Retry-After), or delete jobs you no longer need "
        "(autofusion jobs delete ID)",
    ),
    (EXIT_INTERRUPTED, "interrupted", "interrupted (Ctrl-C)"),
)

_BY_STATUS = {
    409: EXIT_CONFLICT,
    412: EXIT_CONFLICT,
    413: EXIT_BAD_INPUT,
    415: EXIT_BAD_INPUT,
    422: EXIT_BAD_INPUT,
}


# Problem types that are the tenant's quota (app/services/quotas.py), whatever the status.
_QUOTA_PROBLEMS = ("too-many-queued-jobs", "storage-quota-exceeded")
# A 422 about the config (an unknown strategy, pattern or option) is a usage error, as
# the same mistake is for `autofusion optimize`; a 422 about the model stays bad input.
_USAGE_PROBLEMS = ("invalid-config",)


def for_http_status(status: int, problem_type: str = "") -> int:
    """The exit code of a request the server answered with this error status (and this
    problem ``type``, a URI or a slug, when it sent one)."""
    slug = problem_type.rsplit("/", 1)[-1]
    if status == 507 or slug in _QUOTA_PROBLEMS:
        return EXIT_QUOTA
    if slug in _USAGE_PROBLEMS:
        return EXIT_USAGE
    if status in _BY_STATUS:
        return _BY_STATUS[status]
    if status == 429 or status >= 500:
        return EXIT_SERVER
    return EXIT_USAGE


# A failed job's problem type (its slug) -> the code the same mistake has locally.
_BY_JOB_PROBLEM = {
    "check-failed": EXIT_GATE_FAILED,
    "invalid-model": EXIT_BAD_INPUT,
    "invalid-pattern": EXIT_BAD_INPUT,
    "invalid-config": EXIT_USAGE,
    "model-cannot-run": EXIT_USAGE,  # as optimize's "the original cannot run on these inputs"
}


def for_job_problem(slug: str) -> int:
    """The exit code of a job that failed with this problem type (``check-failed``...)."""
    return _BY_JOB_PROBLEM.get(slug, EXIT_JOB_FAILED)


def table_text(indent: str = "  ") -> str:
    """The table as --help shows it."""
    return "\n".join(
        textwrap.fill(
            meaning, 88, initial_indent=f"{indent}{code:<4}", subsequent_indent=indent + " " * 4
        )
        for code, _, meaning in TABLE
    )


def epilog() -> str:
    """The table under a command's --help."""
    return f"exit codes (the table of every autofusion command):\n{table_text()}"
