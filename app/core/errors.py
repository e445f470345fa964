"""The service's domain error: what went wrong, as an RFC 9457 problem, with no web code.

A service raises ``ProblemError`` with the problem's status, type slug, title and a
``detail`` that says what was wrong and what to do; ``app.api.problems`` turns it (and
``fusion_core``'s errors, in one table) into ``application/problem+json``. The status
is part of the problem document (RFC 9457), not of a web framework, so the services
and the worker raise it without importing FastAPI.
"""

from __future__ import annotations

from typing import Any

__all__ = ["JOB_PROBLEMS", "PROBLEM_BASE", "ProblemError", "job_problem"]

PROBLEM_BASE = "https://autofusion.dev/problems/"

# Why a job failed (or why its last attempt did): the slug of its problem type
# (PROBLEM_BASE + slug) and its title. The worker stores the slug (``Job.error_type``)
# and the detail (``Job.error``: what happened and what to do); a job's ``error`` is the
# problem object of the three (docs/service.md, "A failed job says why").
JOB_PROBLEMS = {
    "check-failed": "The fused model failed its numerical check",
    "model-cannot-run": "onnxruntime cannot load or run the original model",
    "invalid-model": "The model cannot be optimized",
    "invalid-config": "The job's options are invalid",
    "invalid-pattern": "A pattern of the registry snapshot is invalid",
    "time-limit": "The optimization ran past the time limit",
    "profile-time-limit": "Profiling did not finish within the time limit",
    "memory-limit": "The optimization ran out of memory",
    "memory-predicted": "The optimization would need more memory than this server allows",
    "crashed": "The optimization process crashed",
    "crashed-twice": "The optimization crashed the same way twice on this model",
    "worker-lost": "The job's worker stopped before finishing",
    "internal-error": "Internal error in the optimizer",
    # Rows written before the worker typed its errors.
    "job-failed": "The job failed",
}


def job_problem(slug: str | None, detail: str) -> dict[str, str]:
    """A job's error as an RFC 9457 problem object: type, title, detail."""
    slug = slug if slug in JOB_PROBLEMS else "job-failed"
    return {"type": PROBLEM_BASE + slug, "title": JOB_PROBLEMS[slug], "detail": detail}


class ProblemError(Exception):
    """Raise anywhere in the service to answer with a problem document; ``headers``
    (``Retry-After``, ``WWW-Authenticate``) go with the response."""

    def __init__(
        self,
        status: int,
        slug: str,
        title: str,
        detail: str,
        *,
        headers: dict[str, str] | None = None,
        **extra: Any,
    ) -> None:
        super().__init__(detail)
        self.status, self.slug, self.title, self.detail = status, slug, title, detail
        self.headers = headers
        self.extra = extra
