"""The tests that need PostgreSQL or Redis skip without them, naming the service, and fail
instead where ``AUTOFUSION_REQUIRE_SERVICES`` is set (``.ci/run``): the helpers of
``tests/services.py`` pointed at a port of 127.0.0.1 where nothing listens."""

from __future__ import annotations

import socket
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests import services

REPO = Path(__file__).resolve().parents[1]


def _closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (bound once, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def nothing_running(monkeypatch: pytest.MonkeyPatch) -> int:
    port = _closed_port()
    monkeypatch.setattr(services, "PG_SERVER", f"postgresql+psycopg://postgres@127.0.0.1:{port}")
    monkeypatch.setattr(services, "REDIS_PORT", port)
    return port


HELPERS: dict[str, Callable[[], AbstractContextManager]] = {
    "PostgreSQL": lambda: services.fresh_postgres_database(),
    "Redis": lambda: services.empty_redis_db(),
}


@pytest.mark.parametrize("service", sorted(HELPERS))
@pytest.mark.parametrize("value", [None, "", "0"], ids=["unset", "empty", "zero"])
def test_a_missing_service_skips_naming_it(
    service: str, value: str | None, nothing_running: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if value is None:
        monkeypatch.delenv(services.REQUIRE_ENV, raising=False)
    else:
        monkeypatch.setenv(services.REQUIRE_ENV, value)
    with pytest.raises(pytest.skip.Exception) as skipped, HELPERS[service]():
        pytest.fail("entered without the service")
    reason = str(skipped.value)
    assert reason.startswith(f"{service} is not available at 127.0.0.1:{nothing_running} (")
    assert "refused" in reason.lower() and reason.endswith("; .ci/run starts it")


@pytest.mark.parametrize("service", sorted(HELPERS))
def test_a_missing_service_fails_where_services_are_required(
    service: str, nothing_running: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(services.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception) as failed, HELPERS[service]():
        pass
    message = str(failed.value)
    want = f"{services.REQUIRE_ENV} is set but {service} is not available at 127.0.0.1:"
    assert message.startswith(f"{want}{nothing_running} (")


def test_an_explicit_skip_is_still_a_failure_where_services_are_required(
    nothing_running: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A caller passing ``pytest.skip`` (the helpers' old signature) cannot opt out."""
    monkeypatch.setenv(services.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception), services.fresh_postgres_database(pytest.skip):
        pass


def test_ci_requires_the_services_it_starts() -> None:
    script = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert f"export {services.REQUIRE_ENV}=1" in script
    assert script.index(f"export {services.REQUIRE_ENV}=1") < script.index("make test\n")
    assert "pg_ctlcluster" in script and "redis-server" in script
