"""Dependencies shared by the routes, as ``Annotated`` aliases."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import APIKeyHeader, HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from autofusion.app.core import tracing
from autofusion.app.core.config import Settings
from autofusion.app.core.db import POOL_CONNECTIONS, retry_stale, session_factory
from autofusion.app.core.errors import ProblemError
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.auth import (
    SCOPES,
    Principal,
    authenticate,
    cached_principal,
    ensure_tenant,
)

__all__ = [
    "PrincipalDep",
    "SessionDep",
    "SettingsDep",
    "StoreDep",
    "WWW_AUTHENTICATE",
    "check_scope",
    "principal_for_token",
    "require_scope",
]


# Cheap dependencies are async: FastAPI runs a sync one in a worker thread, a hop that
# cost a poll more than its query did (issue 15, item 9).
async def get_settings_dep(request: Request) -> Settings:
    return request.app.state.settings


SettingsDep = Annotated[Settings, Depends(get_settings_dep)]


async def get_session(settings: SettingsDep) -> AsyncIterator[Session]:
    """A session per request, closed as soon as the route and its response serialization
    are done (``scope="function"``), in the event loop (async: no worker thread needed).

    Sync routes and FastAPI's serialization of their results run in worker threads. If
    more requests held connections than the pool has, a thread could wait for a
    connection that belongs to a request waiting for a thread: the pool and the thread
    pool deadlock (seen under load: docs/benchmarks.md, "The service under load";
    tests/app/test_concurrency.py). So at most ``REQUEST_SESSIONS`` requests hold a
    session at once (the rest wait in the event loop, using no thread), fewer than the
    pool's connections, and fewer than the worker threads.
    """
    session = session_factory(settings.resolved_database_url)()
    try:
        yield session
    finally:
        session.close()


# Below the pool's connections: the rest serve the embedded worker's threads, the
# reaper and the event streams, which take their own sessions.
REQUEST_SESSIONS = POOL_CONNECTIONS - 5
SessionDep = Annotated[
    Session, Depends(get_session, scope="function", max_concurrency=REQUEST_SESSIONS)
]


async def get_store(request: Request) -> ArtifactStore:
    return request.app.state.store


StoreDep = Annotated[ArtifactStore, Depends(get_store)]


# The two ways a key is sent, as OpenAPI security schemes (the published document and
# /docs' Authorize button take them from here). Neither answers by itself: without a
# key, get_principal decides (the default tenant, or 401 where keys are required).
KEY_HELP = (
    "An API key (`autofusion keys create`). A server started without "
    "--require-api-keys also answers requests without one, as its default tenant."
)
BEARER = HTTPBearer(scheme_name="bearerAuth", description=KEY_HELP, auto_error=False)
API_KEY_HEADER = APIKeyHeader(
    name="X-API-Key", scheme_name="apiKeyAuth", description=KEY_HELP, auto_error=False
)


async def get_principal(
    settings: SettingsDep,
    bearer: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)],
    x_api_key: Annotated[str | None, Depends(API_KEY_HEADER)],
) -> Principal:
    token = bearer.credentials.strip() if bearer is not None else x_api_key
    # Most requests (every poll) are answered here, in the event loop, with no I/O.
    known = _known_principal(settings, token)
    if known is None:
        known = await run_in_threadpool(principal_for_token, settings, token)
    tracing.annotate(tenant=known.tenant_id)  # the request's span, when tracing
    return known


def _known_principal(settings: Settings, token: str | None) -> Principal | None:
    if token:
        return cached_principal(token) if settings.api_key_cache_s > 0 else None
    key = (settings.resolved_database_url, settings.default_tenant)
    if not settings.require_api_keys and key in _KNOWN_TENANTS:
        return Principal(settings.default_tenant, frozenset(SCOPES))
    return None


def principal_for_token(settings: Settings, token: str | None) -> Principal:
    """Who ``token`` is (None: no key sent); 401 for an unknown key, or for none when keys
    are required. The API (headers) and the dashboard (its cookie) both come here.

    It takes no request session: the lookup (usually answered by the key cache, see
    app/services/auth.py) uses a session of its own, closed before this returns, so an
    upload authenticates and then streams its body holding no connection."""
    if token:
        with session_factory(settings.resolved_database_url)() as session:
            principal = retry_stale(
                session, lambda s: authenticate(s, token, cache_s=settings.api_key_cache_s)
            )
        if principal is None:
            raise _unauthorized("the API key is unknown or revoked")
        return principal
    if settings.require_api_keys:
        raise _unauthorized("this server requires an API key")
    # Embedded mode without keys: everything belongs to the default tenant.
    _ensure_default_tenant(settings)
    return Principal(settings.default_tenant, frozenset(SCOPES))


_KNOWN_TENANTS: set[tuple[str, str]] = set()  # (database, tenant): tenants are never deleted


def _ensure_default_tenant(settings: Settings) -> None:
    key = (settings.resolved_database_url, settings.default_tenant)
    if key in _KNOWN_TENANTS:
        return
    with session_factory(settings.resolved_database_url)() as session:
        try:
            ensure_tenant(session, settings.default_tenant)
            session.commit()
        except IntegrityError:  # a concurrent first request created it
            session.rollback()
    _KNOWN_TENANTS.add(key)


# RFC 9110: a 401 names the scheme that would work; keys go as Bearer tokens (or in
# X-API-Key, which no scheme describes).
WWW_AUTHENTICATE = 'Bearer realm="autofusion"'


def _unauthorized(detail: str) -> ProblemError:
    error = ProblemError(
        401,
        "unauthorized",
        "Unauthorized",
        f"{detail}: send 'Authorization: Bearer <key>' (create one with `autofusion keys create`)",
    )
    error.headers = {"WWW-Authenticate": WWW_AUTHENTICATE}
    return error


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
    """A dependency: the principal, 403 without ``scope``. The scope is also named in the
    operation's security requirement (OpenAPI 3.1 allows role names there)."""

    # A default, not Annotated: the annotation (a string here) cannot name ``scope``.
    async def check(principal: Principal = Security(get_principal, scopes=[scope])) -> Principal:  # noqa: B008
        return check_scope(principal, scope)

    return check
