"""RFC 9457 problem details: one error vocabulary for the whole API, mapped here.

Services raise ``app.core.errors.ProblemError`` (and ``fusion_core`` its own errors,
mapped in ``_FUSION_STATUS``); this module, the only one that knows FastAPI's handlers,
answers them.

Every error leaves the service as ``application/problem+json`` with a stable ``type``
URI (``https://autofusion.dev/problems/<slug>``), a title, the HTTP status and a
``detail`` that says what was wrong and what to do.

Nothing else ever leaves: ``CatchAllProblems`` (installed with the handlers) turns any
exception no handler knows into a problem+json 500 with an ``error_id`` that the log
line (``logger.exception``) carries too, and a database that cannot be reached into a
503 with ``Retry-After``. Under ``/ui`` the same becomes an HTML error page (the
dashboard sets ``app.state.error_page``; a plain page otherwise).
"""

from __future__ import annotations

import copy
import html
import logging
import uuid
from collections.abc import Callable
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.routing import iter_route_contexts
from sqlalchemy.exc import DisconnectionError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request as StarletteRequest
from starlette.responses import Response
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autofusion.app.core.errors import PROBLEM_BASE, ProblemError
from autofusion.fusion_core.errors import (
    ConfigError,
    FusionError,
    ModelLoadError,
    PatternError,
    UnsafeModelError,
    describe_fields,
    field_errors,
)

__all__ = [
    "DATABASE_RETRY_AFTER_S",
    "PROBLEM_BASE",
    "CatchAllProblems",
    "ProblemError",
    "install_problem_handlers",
    "problem_response",
    "problem_responses",
]

MEDIA_TYPE = "application/problem+json"
# What a 503 during a database outage asks the client to wait before it retries.
DATABASE_RETRY_AFTER_S = 5

logger = logging.getLogger(__name__)

_FUSION_STATUS = {
    ModelLoadError: 422,
    UnsafeModelError: 422,
    PatternError: 422,
    ConfigError: 422,
}


# For OpenAPI (#/components/schemas/Problem, app/api/openapi_contract.py): what every
# error response looks like; further extension members vary by type.
PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "description": "RFC 9457 problem details. `type` is stable: "
    f"{PROBLEM_BASE}<slug>; `detail` says what was wrong and what to do.",
    "type": "object",
    "required": ["type", "title", "status", "detail"],
    "properties": {
        "type": {"type": "string", "format": "uri"},
        "title": {"type": "string"},
        "status": {"type": "integer", "minimum": 400, "maximum": 599},
        "detail": {"type": "string"},
        "errors": {
            "type": "array",
            "description": "Invalid requests: each field that was wrong, and why.",
            "items": {
                "type": "object",
                "required": ["field", "message"],
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
        "error_id": {
            "type": "string",
            "description": "Internal errors: the id the server's log line carries too.",
        },
    },
    "additionalProperties": True,
}


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` for a route: these statuses answer ``application/problem+json``."""
    return {
        status: {"content": {MEDIA_TYPE: {"schema": copy.deepcopy(PROBLEM_SCHEMA)}}}
        for status in statuses
    }


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
    """The exception handlers (one table: domain errors, validation, HTTP errors) and,
    around them, the catch-all for everything else."""
    app.add_middleware(CatchAllProblems)

    @app.exception_handler(ProblemError)
    async def _problem(_: Request, exc: ProblemError) -> JSONResponse:
        headers = getattr(exc, "headers", None)  # e.g. WWW-Authenticate, Retry-After
        return problem_response(
            exc.status, exc.slug, exc.title, exc.detail, headers=headers, **exc.extra
        )

    @app.exception_handler(FusionError)
    async def _fusion(_: Request, exc: FusionError) -> JSONResponse:
        status = next((s for cls, s in _FUSION_STATUS.items() if isinstance(exc, cls)), 422)
        extra: dict[str, Any] = {}
        if isinstance(exc, PatternError) and exc.errors:
            extra["errors"] = [{"field": f, "message": m} for f, m in exc.errors]
        return problem_response(status, exc.code, type(exc).__name__, str(exc), **extra)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        pairs = field_errors(exc)
        errors = [{"field": f, "message": m} for f, m in pairs]
        detail = describe_fields(pairs)
        return problem_response(422, "invalid-request", "Invalid request", detail, errors=errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        status = exc.status_code
        title = _status_phrase(status)
        detail = str(exc.detail) if exc.detail and str(exc.detail) != title else ""
        if status == 404 and not detail:
            detail = f"there is no {request.url.path!r} here; the routes are in /openapi.json"
        headers = dict(getattr(exc, "headers", None) or {})
        if status == 405:
            # Starlette names the methods of the first route of the path only; a path
            # served by several routes (GET and POST /v1/patterns) allows them all.
            allowed = _allowed_methods(request) or headers.get("Allow", "")
            headers["Allow"] = allowed
            detail = f"{request.method} is not allowed on {request.url.path!r}" + (
                f"; allowed: {allowed}" if allowed else ""
            )
        return problem_response(
            status, _HTTP_SLUGS.get(status, "http-error"), title, detail or title, headers=headers
        )

    # The last resort: ServerErrorMiddleware, outside every user middleware, answers
    # with this what escaped them all (CatchAllProblems sits inside them).
    app.add_exception_handler(Exception, _last_resort)


# The problem types of the HTTP errors Starlette raises itself (routing, methods).
_HTTP_SLUGS = {
    400: "bad-request",
    401: "unauthorized",
    403: "forbidden",
    404: "not-found",
    405: "method-not-allowed",
    406: "not-acceptable",
    413: "payload-too-large",
    415: "unsupported-media-type",
    416: "range-not-satisfiable",
}


def _allowed_methods(request: Request) -> str:
    """The methods the routes of this path take, as an Allow value."""
    methods: set[str] = set()
    for route in iter_route_contexts(request.app.routes):
        if route.methods and route.matches(request.scope)[0] != Match.NONE:
            methods |= set(route.methods)
    return ", ".join(sorted(methods))


def _status_phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


async def _last_resort(request: StarletteRequest, exc: Exception) -> Response:
    error_id = uuid.uuid4().hex[:16]
    logger.error(
        "error_id=%s: %s %s failed outside the handlers with %s (answered 500)",
        error_id,
        request.method,
        request.url.path,
        type(exc).__name__,
        exc_info=exc,
    )
    status, slug, title, detail = _INTERNAL
    return CatchAllProblems._response(
        request.scope, status, slug, title, detail, error_id, headers=None
    )


# (status, slug, title, detail) of an exception no handler knows; the detail never
# carries the exception's text (it may hold paths, SQL or secrets): the log has it.
_DATABASE_DOWN = (
    503,
    "database-unavailable",
    "Database unavailable",
    "the service cannot reach its database right now; retry in a few seconds "
    "(Retry-After), and tell the operator if it lasts (quote the error_id)",
)
_INTERNAL = (
    500,
    "internal-error",
    "Internal error",
    "the service failed unexpectedly on this request; nothing was changed by the failed "
    "step. Retry, and if it happens again report the error_id to the operator",
)
ErrorPage = Callable[[StarletteRequest, int, str, str, str], Response]


def _is_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


def _plain_error_page(status: int, title: str, detail: str, error_id: str) -> Response:
    body = (
        f"<!doctype html><title>{status} {html.escape(title)}</title>"
        f"<h1>{status}: {html.escape(title)}</h1><p>{html.escape(detail)}</p>"
        f"<p>error id: <code>{html.escape(error_id)}</code></p>"
    )
    return HTMLResponse(body, status_code=status)


class _ErrorBodyAsProblem:
    """Passes a response through, unless it is an error that some component answered in
    its own words (Starlette's FileResponse: a text/plain 416 or 400 for a bad Range):
    that one leaves as a problem of its status, the headers kept (Content-Range), the
    short plain text as the detail. The dashboard's pages and HEAD are left alone."""

    def __init__(self, scope: Scope, send: Send) -> None:
        self.scope, self._send = scope, send
        self.held: Message | None = None
        self.body = b""

    def _rewrites(self, message: Message) -> bool:
        if message["status"] < 400 or _is_ui(self.scope.get("path", "")):
            return False
        if self.scope.get("method") == "HEAD":
            return False
        headers = dict(message.get("headers") or [])
        content_type = headers.get(b"content-type", b"").decode("latin-1")
        return not content_type.startswith((MEDIA_TYPE, "text/html"))

    async def send(self, message: Message) -> None:
        if message["type"] == "http.response.start" and self._rewrites(message):
            self.held = message
            return
        if self.held is None or message["type"] != "http.response.body":
            await self._send(message)
            return
        self.body += message.get("body", b"")
        if not message.get("more_body", False):
            await self._answer()

    async def _answer(self) -> None:
        status = self.held["status"]
        kept = {
            name.decode("latin-1"): value.decode("latin-1")
            for name, value in self.held.get("headers") or []
            if name.lower() not in (b"content-type", b"content-length")
        }
        text = self.body.decode("utf-8", "replace").strip()
        title = _status_phrase(status)
        detail = text if text and len(text) <= 200 and text != title else title
        response = problem_response(
            status, _HTTP_SLUGS.get(status, "http-error"), title, detail, headers=kept
        )
        await self._send(
            {"type": "http.response.start", "status": status, "headers": response.raw_headers}
        )
        await self._send({"type": "http.response.body", "body": response.body})


class CatchAllProblems:
    """ASGI middleware: an exception that reaches it becomes a problem+json response
    (an HTML page under /ui) with an ``error_id`` logged along with the traceback.

    It sits inside the user middleware, just around the exception handlers, so what it
    answers still passes through metrics and the security headers. An exception after
    the response has started cannot be answered any more: it is logged with its id and
    re-raised for the server to close the connection.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False
        rewrite = _ErrorBodyAsProblem(scope, send)

        async def watch(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await rewrite.send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:
            error_id = uuid.uuid4().hex[:16]
            database = isinstance(exc, OperationalError | DisconnectionError | PoolTimeoutError)
            status, slug, title, detail = _DATABASE_DOWN if database else _INTERNAL
            logger.exception(
                "error_id=%s: %s %s failed with %s (answered %d)",
                error_id,
                scope.get("method"),
                scope.get("path"),
                type(exc).__name__,
                status,
            )
            if started:
                raise
            headers = {"Retry-After": str(DATABASE_RETRY_AFTER_S)} if database else None
            response = self._response(scope, status, slug, title, detail, error_id, headers)
            await response(scope, receive, send)

    @staticmethod
    def _response(
        scope: Scope,
        status: int,
        slug: str,
        title: str,
        detail: str,
        error_id: str,
        headers: dict[str, str] | None,
    ) -> Response:
        if _is_ui(scope.get("path", "")):
            app = scope.get("app")
            page: ErrorPage | None = getattr(getattr(app, "state", None), "error_page", None)
            try:
                if page is not None:
                    response = page(StarletteRequest(scope), status, title, detail, error_id)
                else:
                    response = _plain_error_page(status, title, detail, error_id)
            except Exception:  # the page itself failed (a template): the plain one
                logger.exception("error_id=%s: the dashboard's error page failed", error_id)
                response = _plain_error_page(status, title, detail, error_id)
            response.headers.update(headers or {})
            return response
        return problem_response(status, slug, title, detail, headers=headers, error_id=error_id)
