"""API keys and tenants. A key is shown once at creation; only its sha256 is stored."""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.models import ApiKey, Tenant

__all__ = ["SCOPES", "Principal", "authenticate", "create_key", "ensure_tenant"]

SCOPES = ("jobs:write", "patterns:write", "admin")
_PREFIX_LEN = 11  # "af_" + 8 characters


@dataclass(frozen=True)
class Principal:
    tenant_id: str
    scopes: frozenset[str]
    key_id: int | None = None  # None: anonymous (embedded mode without keys)

    def can(self, scope: str) -> bool:
        return scope in self.scopes or "admin" in self.scopes

    @property
    def label(self) -> str:
        return f"key:{self.key_id}" if self.key_id is not None else "anonymous"


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def ensure_tenant(session: Session, tenant_id: str) -> Tenant:
    tenant = session.get(Tenant, tenant_id)
    if tenant is None:
        tenant = Tenant(id=tenant_id)
        session.add(tenant)
        session.flush()
    return tenant


def create_key(session: Session, tenant_id: str, scopes: list[str], name: str = "") -> str:
    """Create a key for ``tenant_id`` (created if new) and return the token, once."""
    unknown = sorted(set(scopes) - set(SCOPES))
    if unknown:
        raise ValueError(f"unknown scope(s) {unknown}; known: {list(SCOPES)}")
    ensure_tenant(session, tenant_id)
    token = "af_" + secrets.token_urlsafe(32)
    session.add(
        ApiKey(
            tenant_id=tenant_id,
            prefix=token[:_PREFIX_LEN],
            key_hash=_hash(token),
            scopes=sorted(set(scopes)),
            name=name,
        )
    )
    session.flush()
    return token


def authenticate(session: Session, token: str) -> Principal | None:
    key = session.scalars(select(ApiKey).where(ApiKey.key_hash == _hash(token))).first()
    if key is None or key.revoked_at is not None:
        return None
    return Principal(key.tenant_id, frozenset(key.scopes), key.id)
