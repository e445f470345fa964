"""RFC 9457 problem details: one error vocabulary for the whole API.

Every error leaves the service as ``application/problem+json`` with a stable ``type``
URI (``https://autofusion.dev/problems/<slug>``), a title, the HTTP status and a
``detail`` that says what was wrong and what to do.
"""

from __future__ import annotations

import copy
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from fusion_core.errors import (
    ConfigError,
    FusionError,
    ModelLoadError,
    PatternError,
    UnsafeModelError,
)

__all__ = [
    "PROBLEM_BASE",
    "ProblemError",
    "install_problem_handlers",
    "problem_response",
    "problem_responses",
]

PROBLEM_BASE = "https://autofusion.dev/problems/"
MEDIA_TYPE = "application/problem+json"

_FUSION_STATUS = {
    ModelLoadError: 422,
    UnsafeModelError: 422,
    PatternError: 422,
    ConfigError: 422,
}


# For OpenAPI: what every error response looks like (extension members vary by type).
PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
    },
    "additionalProperties": True,
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: these statuses answer ``application/problem+json``."""
    return {
        status: {"content": {MEDIA_TYPE: {"schema": copy.deepcopy(PROBLEM_SCHEMA)}}}
        for status in statuses
    }


class ProblemError(Exception):
    """Raise anywhere in the service to answer with a problem document."""

    def __init__(self, status: int, slug: str, title: str, detail: str, **extra: Any) -> None:
        super().__init__(detail)
        self.status, self.slug, self.title, self.detail, self.extra = (
            status,
            slug,
            title,
            detail,
            extra,
        )


def problem_response(
    status: int, slug: str, title: str, detail: str, headers: dict | None = None, **extra: Any
) -> JSONResponse:
    body = {
        "type": PROBLEM_BASE + slug,
        "title": title,
        "status": status,
        "detail": detail,
        **extra,
    }
    return JSONResponse(body, status_code=status, media_type=MEDIA_TYPE, headers=headers)


def install_problem_handlers(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(_: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(exc.status, exc.slug, exc.title, exc.detail, **exc.extra)

    @app.exception_handler(FusionError)
    async def _fusion(_: Request, exc: FusionError) -> JSONResponse:
        status = next((s for cls, s in _FUSION_STATUS.items() if isinstance(exc, cls)), 422)
        extra: dict[str, Any] = {}
        if isinstance(exc, PatternError) and exc.errors:
            extra["errors"] = [{"field": f, "message": m} for f, m in exc.errors]
        return problem_response(status, exc.code, type(exc).__name__, str(exc), **extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"field": ".".join(str(p) for p in e["loc"]), "message": e["msg"]} for e in exc.errors()
        ]
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        return problem_response(422, "invalid-request", "Invalid request", detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        slug = {401: "unauthorized", 403: "forbidden", 404: "not-found", 405: "method-not-allowed"}
        return problem_response(
            exc.status_code,
            slug.get(exc.status_code, "http-error"),
            str(exc.detail) if exc.status_code >= 500 else slug.get(exc.status_code, "error"),
            str(exc.detail),
            headers=getattr(exc, "headers", None),
        )
