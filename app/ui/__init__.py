"""The web dashboard under ``/ui``: server-rendered pages (Jinja2) with vendored htmx.

``install_ui(app)`` adds the pages (left out of the OpenAPI document: the API is the
published contract, the dashboard is not), the static files at ``/ui/static`` and the
report's one stylesheet at ``/ui/report.css`` (fusion_core's, which report.html inlines), a
Content-Security-Policy on every ``/ui`` response, and error pages: a problem raised
under ``/ui`` renders as HTML, everywhere else it stays problem+json.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autofusion.app.core.errors import ProblemError
from autofusion.app.ui.common import LoginRequired, login_redirect, render
from autofusion.app.ui.routes import router
from autofusion.fusion_core.errors import FusionError, describe_fields, field_errors
from autofusion.fusion_core.report import REPORT_STYLESHEET

__all__ = ["CSP", "install_ui"]

CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
    "script-src 'self'; object-src 'none'; frame-ancestors 'none'; base-uri 'none'"
)
_STATIC = Path(__file__).resolve().parent / "static"
# The report's styles, one file for report.html and the dashboard (fusion_core's).
REPORT_CSS = "/ui/report.css"


def is_ui_path(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


class SecurityHeaders:
    """Adds the CSP (unless the response set a stricter one) to every /ui response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not is_ui_path(scope["path"]):
            await self.app(scope, receive, send)
            return
        if scope["method"] not in ("GET", "HEAD") and _cross_site(scope):
            await _refuse_cross_site(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {name.lower() for name, _ in headers}
                if b"content-security-policy" not in names:
                    headers.append((b"content-security-policy", CSP.encode()))
                headers.append((b"x-content-type-options", b"nosniff"))
                headers.append((b"referrer-policy", b"same-origin"))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _cross_site(scope: Scope) -> bool:
    """A state-changing request another site started. Without API keys (a local
    ``make run``) there is no cookie for SameSite to withhold, so any page the user
    visits could post a form to 127.0.0.1: the browser's ``Sec-Fetch-Site`` (or, from
    older browsers, ``Origin`` against ``Host``) tells us, and such a request is refused."""
    headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
    site = headers.get("sec-fetch-site")
    if site is not None:
        return site not in ("same-origin", "none")
    origin = headers.get("origin")
    if origin is None:
        return False  # not a browser (curl, tests): no ambient credentials to abuse
    return origin == "null" or urlsplit(origin).netloc != headers.get("host", "")


async def _refuse_cross_site(scope: Scope, receive: Receive, send: Send) -> None:
    # A page like every other dashboard error (no text/plain error anywhere, issue 18).
    body = (
        b'<!doctype html><title>403 Forbidden</title><h1>403: Forbidden</h1><div id="error" '
        b'class="problem" data-status="403"><p>cross-site request refused: submit the form '
        b"from the dashboard itself</p></div>"
    )
    await send(
        {
            "type": "http.response.start",
            "status": 403,
            "headers": [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-security-policy", CSP.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _error_page(request: Request, exc: Exception):
    if isinstance(exc, ProblemError):
        status, title, detail = exc.status, exc.title, exc.detail
    elif isinstance(exc, FusionError):
        status, title, detail = 422, type(exc).__name__, str(exc)
    elif isinstance(exc, StarletteHTTPException):
        status, title, detail = exc.status_code, "Error", str(exc.detail)
    else:  # RequestValidationError
        status, title, detail = 422, "Invalid request", describe_fields(field_errors(exc))
    context = {"status": status, "title": title, "detail": detail}
    return render(request, "error.html", context, status_code=status)


def _crash_page(request: Request, status: int, title: str, detail: str, error_id: str):
    """The page of an unexpected error (app.api.problems.CatchAllProblems), with its id."""
    context = {"status": status, "title": title, "detail": detail, "error_id": error_id}
    return render(request, "error.html", context, status_code=status)


def _install_error_pages(app: FastAPI) -> None:
    app.state.error_page = _crash_page  # what CatchAllProblems renders under /ui
    for exc_class in (ProblemError, FusionError, StarletteHTTPException, RequestValidationError):
        api_handler = app.exception_handlers.get(exc_class)

        async def handler(request: Request, exc: Exception, api_handler=api_handler):
            if is_ui_path(request.url.path) or api_handler is None:
                return _error_page(request, exc)
            return await api_handler(request, exc)

        app.add_exception_handler(exc_class, handler)

    async def login_required(request: Request, exc: LoginRequired):
        return login_redirect(request, exc.reason)

    app.add_exception_handler(LoginRequired, login_required)


async def _report_stylesheet() -> FileResponse:
    """The report's one sheet, which report.html inlines (base.html links it)."""
    return FileResponse(REPORT_STYLESHEET, media_type="text/css")


def install_ui(app: FastAPI) -> None:
    app.include_router(router)
    app.add_api_route(
        REPORT_CSS, _report_stylesheet, methods=["GET", "HEAD"], include_in_schema=False
    )
    app.mount("/ui/static", StaticFiles(directory=_STATIC), name="ui-static")
    app.add_middleware(SecurityHeaders)
    _install_error_pages(app)
