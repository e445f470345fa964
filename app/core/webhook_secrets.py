"""Webhook signing secrets in the Standard Webhooks form: ``whsec_`` and the key's base64.

Below the settings and the services both: the settings check ``webhook_secret`` with
``is_webhook_secret``; the webhooks service makes tenants' secrets with
``new_webhook_secret`` (https://www.standardwebhooks.com/, "Signature scheme").
"""

from __future__ import annotations

import base64
import binascii
import secrets

__all__ = ["PREFIX", "is_webhook_secret", "new_webhook_secret", "secret_key"]

PREFIX = "whsec_"
# The specification asks for keys of 24 to 64 bytes.
_MIN_BYTES, _MAX_BYTES = 24, 64


def secret_key(secret: str) -> bytes:
    """The HMAC key of a ``whsec_`` secret: its base64 part, decoded. ValueError if it is
    not one."""
    if not secret.startswith(PREFIX):
        raise ValueError(f"a webhook secret starts with {PREFIX!r}")
    try:
        key = base64.b64decode(secret[len(PREFIX) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the part after 'whsec_' is not base64") from None
    if not _MIN_BYTES <= len(key) <= _MAX_BYTES:
        raise ValueError(f"the key is {len(key)} bytes; it must be {_MIN_BYTES} to {_MAX_BYTES}")
    return key


def is_webhook_secret(secret: str) -> bool:
    try:
        secret_key(secret)
    except ValueError:
        return False
    return True


def new_webhook_secret() -> str:
    """A fresh secret of 32 random bytes."""
    return PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
