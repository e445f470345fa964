"""The dashboard's router: /ui, sign in and out, and the pages of each resource
(app/ui/jobs.py, submit.py, patterns.py, strategies.py). None is in the OpenAPI document."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse

from autofusion.app.api.deps import WWW_AUTHENTICATE, SessionDep, SettingsDep
from autofusion.app.core.config import Settings
from autofusion.app.services.auth import authenticate
from autofusion.app.services.ui_sessions import issue_session
from autofusion.app.ui import jobs, pattern_classes, patterns, strategies, submit
from autofusion.app.ui.common import COOKIE, LOGIN_REASONS, render, safe_next

__all__ = ["router"]

router = APIRouter(include_in_schema=False)
for module in (jobs, submit, patterns, pattern_classes, strategies):
    router.include_router(module.router)


@router.get("/")
@router.get("/ui")
def home() -> RedirectResponse:
    """The server's root opens the dashboard (README: `make run`, then open :8000)."""
    return RedirectResponse("/ui/jobs", status_code=303)


@router.get("/ui/login")
def login_page(
    request: Request, settings: SettingsDep, reason: str | None = None, next: str | None = None
):
    """Paste an API key; the sign-in is kept in an HttpOnly cookie for this dashboard."""
    context = {
        "message": LOGIN_REASONS.get(reason or ""),
        "next": safe_next(next),
        "keys_required": settings.require_api_keys,
        "errors": [],
    }
    return render(request, "login.html", context)


@router.post("/ui/login")
def login(
    request: Request,
    session: SessionDep,
    settings: SettingsDep,
    key: Annotated[str, Form(max_length=500)] = "",
    next: Annotated[str | None, Form()] = None,
):
    """Check the key as the API would; on success sign in (a cookie naming the key)."""
    key = key.strip()
    principal = authenticate(session, key) if key else None
    if principal is None:
        message = "Paste an API key." if not key else "This API key is unknown or was revoked."
        context = {
            "message": None,
            "next": safe_next(next),
            "keys_required": settings.require_api_keys,
            "errors": [{"field": "key", "message": message}],
        }
        headers = {"WWW-Authenticate": WWW_AUTHENTICATE}
        return render(request, "login.html", context, status_code=401, headers=headers)
    response = RedirectResponse(safe_next(next), status_code=303)
    response.set_cookie(
        COOKIE,
        issue_session(settings, session, principal),  # a signed token, not the key
        max_age=settings.ui_session_max_age_s,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=_secure(request, settings),
    )
    return response


def _secure(request: Request, settings: Settings) -> bool:
    """Secure over https (as uvicorn saw it, proxy headers included), or always when
    the operator says so (a TLS proxy whose headers uvicorn does not trust)."""
    return settings.ui_cookie_secure or request.url.scheme == "https"


@router.api_route("/ui/logout", methods=["GET", "POST"])
def logout(request: Request, settings: SettingsDep) -> RedirectResponse:
    """Forget the sign-in (the cookie); the key itself stays valid."""
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(
        COOKIE, path="/ui", httponly=True, samesite="strict", secure=_secure(request, settings)
    )
    return response
