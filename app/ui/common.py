"""What every dashboard page shares: templates, the principal from the cookie, errors.

Authentication is the API's keys: the key a user pasted on /ui/login is checked as the
API checks it, and the ``af_key`` cookie (HttpOnly, SameSite=Strict, path /ui, Secure
over https) then holds a signed session token naming that key, never the key
(``app.services.ui_sessions``); every request checks the token and the key's row.

CSRF: every form that changes state is a POST, and the cookie is SameSite=Strict, so a
browser never sends it with a request another site starts. Without API keys there is no
cookie to withhold, so ``app/ui/__init__.py`` also refuses any state-changing /ui request
the browser marks as cross-site (``Sec-Fetch-Site``, else ``Origin`` against ``Host``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.templating import Jinja2Templates
from jinja2 import ChoiceLoader, Environment, FileSystemLoader

from autofusion.app.api.deps import SettingsDep, check_scope, principal_for_token
from autofusion.app.core.errors import ProblemError
from autofusion.app.services.auth import Principal
from autofusion.app.services.ui_sessions import session_principal
from autofusion.app.services.worker_health import check_worker
from autofusion.fusion_core.report import REPORT_TEMPLATES

__all__ = [
    "COOKIE",
    "LoginRequired",
    "UIPrincipal",
    "form_errors",
    "login_redirect",
    "render",
    "require",
    "templates",
]

COOKIE = "af_key"
_TEMPLATES = Path(__file__).resolve().parent / "templates"

# Autoescape everywhere: every string a user controls (model and node names, doc
# strings, pattern text, error messages) renders as text. Only SVG made by
# fusion_core.report's helpers (which escape every label) is marked safe. The job page's
# report section (_report.html) is fusion_core.report's, the template report.html renders.
_LOADER = ChoiceLoader([FileSystemLoader(_TEMPLATES), FileSystemLoader(REPORT_TEMPLATES)])
templates = Jinja2Templates(env=Environment(loader=_LOADER, autoescape=True, auto_reload=False))

LOGIN_REASONS = {
    "required": "This server requires an API key: paste yours to continue.",
    "invalid": "Your API key is unknown or was revoked: paste a valid one.",
}


class LoginRequired(Exception):
    """No valid key in the cookie while the server requires one: go to /ui/login."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def ui_principal(request: Request, settings: SettingsDep) -> Principal:
    cookie = request.cookies.get(COOKIE)
    if cookie:
        principal = session_principal(settings, cookie)
        if principal is None:  # forged, altered, expired, or its key was revoked
            raise LoginRequired("invalid")
        return principal
    try:
        return principal_for_token(settings, None)
    except ProblemError as exc:
        if exc.status == 401:
            raise LoginRequired("required") from None
        raise


UIPrincipal = Annotated[Principal, Depends(ui_principal)]


def require(principal: Principal, scope: str) -> Principal:
    """The API's scope check (403, shown as an error page)."""
    return check_scope(principal, scope)


def safe_next(path: str | None) -> str:
    """Only a path of this dashboard: never another host (no open redirect)."""
    if path and path.startswith("/ui") and not path.startswith("//") and "\\" not in path:
        return path
    return "/ui/jobs"


def login_redirect(request: Request, reason: str) -> RedirectResponse:
    target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    if request.method != "GET":
        target = "/ui/jobs"
    url = f"/ui/login?reason={quote(reason)}&next={quote(safe_next(target), safe='')}"
    response = RedirectResponse(url, status_code=303)
    if request.headers.get("hx-request"):
        response.headers["HX-Redirect"] = url  # a polled fragment: move the whole page
    return response


def render(
    request: Request,
    name: str,
    context: dict[str, Any] | None = None,
    *,
    status_code: int = 200,
    headers: dict[str, str] | None = None,
) -> HTMLResponse:
    context = {"request": request, **(context or {})}
    context.setdefault("signed_in", COOKIE in request.cookies)
    # A server that needs no key offers no sign-in in the header (/ui/login still works).
    settings = getattr(request.app.state, "settings", None)
    context.setdefault("keys_required", bool(getattr(settings, "require_api_keys", True)))
    if not name.startswith("_"):  # a whole page, not a polled fragment: one query more
        context.setdefault("worker_banner", worker_banner(request))
    return templates.TemplateResponse(
        request, name, context, status_code=status_code, headers=headers
    )


def worker_banner(request: Request) -> str | None:
    """What the banner says while no worker can take a job (None: no banner)."""
    settings = getattr(request.app.state, "settings", None)
    if settings is None:
        return None
    local = getattr(request.app.state, "local_worker", None)
    reason = check_worker(settings, local)
    return None if reason is None else f"No worker is taking jobs: {reason}. Queued jobs wait."


def form_errors(exc: Exception, default_field: str) -> tuple[int, list[dict[str, str]]]:
    """The HTTP status and ``[{field, message}]`` of a failed write, whatever raised it
    (a ProblemError, a FusionError such as PatternError, or a pydantic ValidationError)."""
    from pydantic import ValidationError

    from autofusion.fusion_core.errors import FusionError, PatternError, field_errors

    if isinstance(exc, ValidationError):
        pairs = field_errors(exc, default=default_field)
        return 422, [{"field": f, "message": m} for f, m in pairs]
    if isinstance(exc, PatternError) and exc.errors:
        return 422, [{"field": f or default_field, "message": m} for f, m in exc.errors]
    if isinstance(exc, FusionError):
        return 422, [{"field": default_field, "message": str(exc)}]
    if isinstance(exc, ProblemError):
        listed = exc.extra.get("errors")
        if isinstance(listed, list) and listed:
            return exc.status, [
                {"field": str(e.get("field") or default_field), "message": str(e.get("message"))}
                for e in listed
            ]
        field = str(exc.extra.get("field") or default_field)
        return exc.status, [{"field": field, "message": exc.detail}]
    raise exc
