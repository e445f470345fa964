"""Dashboard sign-ins (issue 26): the cookie names an API key and is signed; it is never
the key itself.

A cookie is ``v1.<key id>.<expires>.<signature>``: the signature is an HMAC-SHA256,
under the server's secret, of the key id, the expiry (Unix seconds) and the key's stored
hash. So nobody makes or alters one without the secret, a cookie read off a browser
never works as an API key, it stops working at its expiry (``ui_session_max_age_s``),
and revoking the key ends every sign-in made with it (each request reads the key's row).

The secret is ``ui_session_secret`` when set (several API processes that share no
``data_dir`` must share it), else a random one kept in ``data_dir/ui_session.key``,
made at first use, readable by the service's user only.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import os
import secrets
import threading
import time
from pathlib import Path

from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.db import retry_stale, session_factory
from autofusion.app.core.models import ApiKey
from autofusion.app.services.auth import Principal

__all__ = ["SECRET_FILE", "issue_session", "session_principal"]

SECRET_FILE = "ui_session.key"
_VERSION = "v1"
_MAX_DIGITS = 19  # a BIGINT: a key id or an expiry, in Unix seconds
_secrets: dict[Path, bytes] = {}
_secrets_lock = threading.Lock()


def issue_session(
    settings: Settings, session: Session, principal: Principal, *, now: float | None = None
) -> str:
    """The cookie value for a sign-in with ``principal``'s key (which must exist)."""
    key = session.get(ApiKey, principal.key_id)
    if key is None:
        raise ValueError(f"no API key {principal.key_id}: authenticate before signing in")
    expires = int(now if now is not None else time.time()) + settings.ui_session_max_age_s
    return f"{_VERSION}.{key.id}.{expires}.{_signature(settings, key, expires)}"


def session_principal(
    settings: Settings, value: str, *, now: float | None = None
) -> Principal | None:
    """The principal of a cookie made by ``issue_session``; None for anything else (forged,
    altered, expired, made under another secret, or of a key since revoked)."""
    parts = value.split(".")
    if len(parts) != 4 or parts[0] != _VERSION:
        return None
    key_id, expires = parts[1], parts[2]
    if not all(_is_number(part) for part in (key_id, expires)):
        return None
    if int(expires) < (now if now is not None else time.time()):
        return None
    with session_factory(settings.resolved_database_url)() as session:
        key = retry_stale(session, lambda s: s.get(ApiKey, int(key_id)))
    if key is None or key.revoked_at is not None:
        return None
    expected = _signature(settings, key, int(expires))
    if not hmac.compare_digest(expected.encode(), parts[3].encode("utf-8", "replace")):
        return None
    return Principal(key.tenant_id, frozenset(key.scopes), key.id)


def _is_number(text: str) -> bool:
    # ASCII digits only (str.isdigit takes "²", which int() refuses), and short: int()
    # of a long string is slow, then refused.
    return 0 < len(text) <= _MAX_DIGITS and text.isascii() and text.isdigit()


def _signature(settings: Settings, key: ApiKey, expires: int) -> str:
    message = f"{_VERSION}.{key.id}.{expires}.{key.key_hash}".encode()
    digest = hmac.new(_secret(settings), message, hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _secret(settings: Settings) -> bytes:
    if settings.ui_session_secret is not None:
        return settings.ui_session_secret.get_secret_value().encode()
    path = (settings.data_dir / SECRET_FILE).resolve()
    with _secrets_lock:
        if path not in _secrets:
            _secrets[path] = _load_or_make(path)
        return _secrets[path]


def _load_or_make(path: Path) -> bytes:
    """The secret in ``path``, written first if there is none: to a private temporary
    file, then linked into place, so that two processes starting at once agree on one
    and neither ever reads a half-written file."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(descriptor, "w") as handle:
                handle.write(secrets.token_hex(32))
            with contextlib.suppress(FileExistsError):  # another process's came first
                os.link(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)
    secret = path.read_text(encoding="ascii").strip()
    if len(secret) < 32:
        raise RuntimeError(
            f"{path} holds no usable secret ({len(secret)} characters); delete it (everyone "
            "signs in again) or set ui_session_secret"
        )
    return secret.encode()
