"""Dependencies shared by the routes, as ``Annotated`` aliases."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Header, Request
from sqlalchemy.orm import Session

from app.core.config import Settings
from app.core.problems import ProblemError
from app.db import session_factory
from app.services.artifacts import ArtifactStore
from app.services.auth import SCOPES, Principal, authenticate, ensure_tenant

__all__ = [
    "PrincipalDep",
    "SessionDep",
    "SettingsDep",
    "StoreDep",
    "check_scope",
    "principal_for_token",
    "require_scope",
]


def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


def get_session(settings: SettingsDep) -> Iterator[Session]:
    session = session_factory(settings.resolved_database_url)()
    try:
        yield session
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]


def get_store(request: Request) -> ArtifactStore:
    return request.app.state.store


StoreDep = Annotated[ArtifactStore, Depends(get_store)]


def get_principal(
    settings: SettingsDep,
    session: SessionDep,
    authorization: Annotated[str | None, Header()] = None,
    x_api_key: Annotated[str | None, Header()] = None,
) -> Principal:
    token = x_api_key
    if authorization and authorization.lower().startswith("bearer "):
        token = authorization[7:].strip()
    return principal_for_token(settings, session, token)


def principal_for_token(settings: Settings, session: Session, token: str | None) -> Principal:
    """Who ``token`` is (None: no key sent); 401 for an unknown key, or for none when keys
    are required. The API (headers) and the dashboard (its cookie) both come here."""
    if token:
        principal = authenticate(session, token)
        if principal is None:
            raise _unauthorized("the API key is unknown or revoked")
        return principal
    if settings.require_api_keys:
        raise _unauthorized("this server requires an API key")
    # Embedded mode without keys: everything belongs to the default tenant.
    ensure_tenant(session, settings.default_tenant)
    session.commit()
    return Principal(settings.default_tenant, frozenset(SCOPES))


def _unauthorized(detail: str) -> ProblemError:
    return ProblemError(
        401,
        "unauthorized",
        "Unauthorized",
        f"{detail}: send 'Authorization: Bearer <key>' (create one with `autofusion keys create`)",
    )


PrincipalDep = Annotated[Principal, Depends(get_principal)]


def check_scope(principal: Principal, scope: str) -> Principal:
    """``principal``, or 403 when it lacks ``scope``."""
    if not principal.can(scope):
        raise ProblemError(
            403,
            "forbidden",
            "Forbidden",
            f"this API key lacks the {scope!r} scope; ask an admin for a key that has it",
        )
    return principal


def require_scope(scope: str):
    def check(principal: PrincipalDep) -> Principal:
        return check_scope(principal, scope)

    return check
