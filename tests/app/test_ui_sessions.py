"""The dashboard's cookie is a signed session token, never the API key (issue 26).

Before: the cookie held the raw key (anyone who read it off a browser had an API key),
and it was Secure only when uvicorn saw https.
"""

from __future__ import annotations

import stat
import time

import pytest
from fastapi.testclient import TestClient
from pydantic import SecretStr

from autofusion.app.core.db import session_scope
from autofusion.app.core.models import ApiKey, utcnow
from autofusion.app.services.auth import create_key
from autofusion.app.services.ui_sessions import SECRET_FILE, session_principal

COOKIE = "af_key"


@pytest.fixture
def keyed(make_service):
    return make_service(require_api_keys=True)


def _key(service, tenant: str = "acme") -> str:
    with session_scope(service.settings.resolved_database_url) as session:
        return create_key(session, tenant, ["jobs:write"])


def _sign_in(client: TestClient, token: str) -> str:
    """POST /ui/login; the Set-Cookie header."""
    response = client.post("/ui/login", data={"key": token}, follow_redirects=False)
    assert response.status_code == 303, response.text
    return response.headers["set-cookie"]


def _attributes(set_cookie: str) -> dict[str, str]:
    pairs = [part.strip().partition("=") for part in set_cookie.split(";")]
    return {name.lower(): value for name, _, value in pairs}


def _use(client: TestClient, value: str) -> None:
    """Send ``value`` as the cookie from now on (instead of the one the server set)."""
    client.cookies.clear()
    client.cookies.set(COOKIE, value, path="/ui")


def _signed_in(client: TestClient) -> bool:
    response = client.get("/ui/jobs", follow_redirects=False)
    if response.status_code == 303:
        assert response.headers["location"].startswith("/ui/login?reason=")
        return False
    assert response.status_code == 200, response.text
    return True


def test_the_cookie_is_a_signed_token_not_the_key(keyed):
    token = _key(keyed)
    set_cookie = _sign_in(keyed.client, token)
    value = keyed.client.cookies[COOKIE]
    assert token not in set_cookie and value != token
    assert value.startswith("v1.") and len(value.split(".")) == 4
    attributes = _attributes(set_cookie)
    assert "httponly" in attributes and attributes["samesite"].lower() == "strict"
    assert attributes["path"] == "/ui" and attributes["max-age"] == str(12 * 3600)
    assert "secure" not in attributes  # plain http, nothing forces it
    assert _signed_in(keyed.client)
    # The raw key, as the cookie held before, signs nobody in.
    _use(keyed.client, token)
    assert not _signed_in(keyed.client)


def test_the_cookie_is_secure_over_https_and_when_the_setting_says_so(keyed, make_service):
    https = TestClient(keyed.app, base_url="https://testserver")
    assert "secure" in _attributes(_sign_in(https, _key(keyed)))
    forced = make_service(require_api_keys=True, ui_cookie_secure=True)
    assert "secure" in _attributes(_sign_in(forced.client, _key(forced)))
    assert "secure" in _attributes(
        forced.client.post("/ui/logout").history[0].headers["set-cookie"]
    )


def _tampered(value: str) -> list[str]:
    version, key_id, expires, signature = value.split(".")
    flipped = signature[:-1] + ("A" if signature[-1] != "A" else "B")
    return [
        f"{version}.{key_id}.{expires}.{flipped}",  # another signature
        f"{version}.{int(key_id) + 1}.{expires}.{signature}",  # another key (it exists)
        f"{version}.{key_id}.{int(expires) + 3600}.{signature}",  # a later expiry
        f"v2.{key_id}.{expires}.{signature}",
        f"{version}.{key_id}.{expires}",
        f"{version}.-{key_id}.{expires}.{signature}",
        f"{version}.{key_id}_0.{expires}.{signature}",  # int() would take it
        f"{version}.{'9' * 5000}.{expires}.{signature}",
        "",
        "not-a-token",
    ]


def test_a_forged_or_tampered_cookie_is_refused(keyed):
    _sign_in(keyed.client, _key(keyed))
    _key(keyed, tenant="other")  # the key of the next id exists
    value = keyed.client.cookies[COOKIE]
    for forged in _tampered(value):
        _use(keyed.client, forged)
        assert not _signed_in(keyed.client), forged
    _use(keyed.client, value)
    assert _signed_in(keyed.client)


def test_a_sign_in_ends_at_its_expiry_and_with_its_key(keyed):
    token = _key(keyed)
    _sign_in(keyed.client, token)
    value = keyed.client.cookies[COOKIE]
    settings = keyed.settings
    assert session_principal(settings, value) is not None
    later = time.time() + settings.ui_session_max_age_s + 1
    assert session_principal(settings, value, now=later) is None
    with session_scope(settings.resolved_database_url) as session:
        for key in session.query(ApiKey):
            key.revoked_at = utcnow()
    assert session_principal(settings, value) is None
    assert not _signed_in(keyed.client)


def test_the_secret_is_private_and_a_cookie_of_another_secret_is_refused(keyed):
    _sign_in(keyed.client, _key(keyed))
    value = keyed.client.cookies[COOKIE]
    secret = keyed.settings.data_dir / SECRET_FILE
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600
    other = keyed.settings.model_copy(update={"ui_session_secret": SecretStr("x" * 32)})
    assert session_principal(other, value) is None
