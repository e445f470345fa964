"""API keys and tenants. A key is shown once at creation; only its sha256 is stored.

Resolving a key costs a query, and every poll of a job resolves one, so ``authenticate``
keeps what it found in a small TTL cache keyed by the key's hash (``KEY_CACHE``): a poll
then makes one round trip, for the job row. Revoking a key through the ORM in this
process (``autofusion keys revoke`` runs elsewhere) drops its entry at once; a key
revoked by another process stops working within the cache's TTL
(``api_key_cache_s``, 10 s by default).
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from autofusion.app.core.models import ApiKey, Tenant

__all__ = [
    "KEY_CACHE",
    "SCOPES",
    "KeyCache",
    "Principal",
    "authenticate",
    "cached_principal",
    "create_key",
    "ensure_tenant",
]

# metrics:read: scrape /metrics (a Prometheus key needs nothing else); admin: everything.
SCOPES = ("jobs:write", "patterns:write", "metrics:read", "admin")
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


class KeyCache:
    """Principals of valid keys by key hash, each for ``ttl_s`` seconds, at most
    ``max_entries`` (least recently used dropped first). Unknown and revoked keys are
    never cached: each such request asks the database again."""

    def __init__(self, max_entries: int = 1024) -> None:
        self.max_entries = max_entries
        self._entries: OrderedDict[str, tuple[float, Principal]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key_hash: str) -> Principal | None:
        with self._lock:
            entry = self._entries.get(key_hash)
            if entry is None:
                return None
            if entry[0] <= time.monotonic():
                del self._entries[key_hash]
                return None
            self._entries.move_to_end(key_hash)
            return entry[1]

    def put(self, key_hash: str, principal: Principal, ttl_s: float) -> None:
        if ttl_s <= 0:
            return
        with self._lock:
            self._entries[key_hash] = (time.monotonic() + ttl_s, principal)
            self._entries.move_to_end(key_hash)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def invalidate(self, key_hash: str | None = None) -> None:
        """Forget one key (``key_hash``) or every key (None)."""
        with self._lock:
            if key_hash is None:
                self._entries.clear()
            else:
                self._entries.pop(key_hash, None)


KEY_CACHE = KeyCache()


@event.listens_for(ApiKey.revoked_at, "set")
def _forget_revoked(target: ApiKey, value, _old, _initiator) -> None:
    if value is not None and target.key_hash:
        KEY_CACHE.invalidate(target.key_hash)


def cached_principal(token: str) -> Principal | None:
    """The principal of ``token`` if the key cache holds it (no I/O), else None."""
    return KEY_CACHE.get(_hash(token))


def authenticate(session: Session, token: str, *, cache_s: float = 0.0) -> Principal | None:
    """The principal of a valid key, else None. ``cache_s`` > 0: answer from
    ``KEY_CACHE`` when it can, and keep a found principal there that long."""
    key_hash = _hash(token)
    if cache_s > 0:
        cached = KEY_CACHE.get(key_hash)
        if cached is not None:
            return cached
    key = session.scalars(select(ApiKey).where(ApiKey.key_hash == key_hash)).first()
    if key is None or key.revoked_at is not None:
        KEY_CACHE.invalidate(key_hash)
        return None
    principal = Principal(key.tenant_id, frozenset(key.scopes), key.id)
    KEY_CACHE.put(key_hash, principal, cache_s)
    return principal
