"""Polls cost one query (issue 15, item 9): ``GET /v1/jobs/{id}`` made about six database
round trips (a pre-ping, the key, the tenant, the job, ...); p95 was 308 ms for 20
pollers. Now the key comes from a TTL cache, connections are not pinged, and a poll is
one statement: the job row. bench/bench_polling.py measures the latency."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import event, text

from autofusion.app.core.db import get_engine
from autofusion.app.core.models import ApiKey
from autofusion.app.services.auth import KEY_CACHE, create_key
from autofusion.app.services.jobs import utcnow


@contextmanager
def counted_statements(url: str) -> Iterator[list[str]]:
    """Every statement the app's engine for ``url`` sends, while the block runs."""
    statements: list[str] = []
    engine = get_engine(url)

    def record(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _keyed(make_service, **settings):
    service = make_service(require_api_keys=True, **settings)
    with service.db() as session:
        token = create_key(session, "t", ["jobs:write"])
    return service, {"Authorization": f"Bearer {token}"}


def _poll_statements(service, headers, tiny_model) -> tuple[list[str], list[str]]:
    job = service.submit(tiny_model, headers=headers).json()
    url = service.settings.resolved_database_url
    with counted_statements(url) as polled:
        response = service.client.get(f"/v1/jobs/{job['id']}", headers=headers)
        assert response.status_code == 200
    with counted_statements(url) as not_modified:
        etag = response.headers["etag"]
        again = service.client.get(
            f"/v1/jobs/{job['id']}", headers={**headers, "If-None-Match": etag}
        )
        assert again.status_code == 304
    return polled, not_modified


def test_a_poll_is_one_statement_on_sqlite(make_service, tiny_model):
    service, headers = _keyed(make_service)
    polled, not_modified = _poll_statements(service, headers, tiny_model)
    assert len(polled) == 1, polled
    assert "FROM jobs" in polled[0]
    assert len(not_modified) == 1, not_modified


def test_a_poll_is_one_statement_on_postgresql(make_service, postgres_url, tiny_model):
    service, headers = _keyed(make_service, database_url=postgres_url)
    polled, not_modified = _poll_statements(service, headers, tiny_model)
    assert len(polled) == 1, polled  # no pre-ping ("SELECT 1"), no key, no tenant
    assert len(not_modified) == 1, not_modified


def test_a_poll_without_keys_is_one_statement_too(service, tiny_model):
    polled, _ = _poll_statements(service, {}, tiny_model)
    assert len(polled) == 1, polled


def test_a_revoked_key_is_refused_at_once_despite_the_cache(make_service, tiny_model):
    service, headers = _keyed(make_service)
    job_id = service.submit(tiny_model, headers=headers).json()["id"]
    assert service.client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
    with service.db() as session:
        for key in session.query(ApiKey).filter_by(tenant_id="t"):
            key.revoked_at = utcnow()
    assert service.client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 401


def test_a_key_revoked_elsewhere_stops_working_within_the_ttl(make_service, tiny_model):
    service, headers = _keyed(make_service, api_key_cache_s=0.01)
    job_id = service.submit(tiny_model, headers=headers).json()["id"]
    assert service.client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
    # Another process (`autofusion keys revoke`) writes the row: no ORM event here.
    with service.db() as session:
        session.execute(text("UPDATE api_keys SET revoked_at = CURRENT_TIMESTAMP"))
    KEY_CACHE.invalidate()  # as the 10 ms TTL would have, without a timed wait
    assert service.client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 401


def test_a_stale_pooled_connection_is_retried_not_an_error(make_service, postgres_url, tiny_model):
    service, headers = _keyed(make_service, database_url=postgres_url)
    job_id = service.submit(tiny_model, headers=headers).json()["id"]
    assert service.client.get(f"/v1/jobs/{job_id}", headers=headers).status_code == 200
    # Every pooled connection dies, as in a database restart.
    admin = get_engine(postgres_url.rsplit("/", 1)[0] + "/postgres")
    name = postgres_url.rsplit("/", 1)[1]
    with admin.connect() as conn:
        conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = :name AND pid <> pg_backend_pid()"
            ),
            {"name": name},
        )
        conn.commit()
    for _ in range(3):
        response = service.client.get(f"/v1/jobs/{job_id}", headers=headers)
        assert response.status_code == 200, response.text


@pytest.fixture(autouse=True)
def _empty_key_cache() -> Iterator[None]:
    KEY_CACHE.invalidate()
    yield
    KEY_CACHE.invalidate()
