"""The service's domain error: what went wrong, as an RFC 9457 problem, with no web code.

A service raises ``ProblemError`` with the problem's status, type slug, title and a
``detail`` that says what was wrong and what to do; ``app.api.problems`` turns it (and
``fusion_core``'s errors, in one table) into ``application/problem+json``. The status
is part of the problem document (RFC 9457), not of a web framework, so the services
and the worker raise it without importing FastAPI.
"""

from __future__ import annotations

from typing import Any

__all__ = ["PROBLEM_BASE", "ProblemError"]

PROBLEM_BASE = "https://autofusion.dev/problems/"


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
