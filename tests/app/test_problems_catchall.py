"""One catch-all problem handler (issue 15, item 4; app/api/problems.py).

No text/plain 500 anywhere: an exception no handler knows is a problem+json 500 whose
``error_id`` is also in the log line (with the traceback), the dashboard gets an HTML
page with the id, and a database outage is a 503 with Retry-After. Before, each of
these answered Starlette's bare ``Internal Server Error`` in text/plain (or raised out
of the app).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine, text

from app.api.problems import DATABASE_RETRY_AFTER_S
from app.services import registry

LOGGER = "app.api.problems"


def _fail(*_args, **_kwargs):
    raise RuntimeError("a bug: secret path /srv/internal/thing")


def _logged_ids(caplog) -> list[str]:
    return [
        match.group(1)
        for record in caplog.records
        if record.name == LOGGER and record.exc_info
        for match in [re.search(r"error_id=(\w+)", record.getMessage())]
        if match
    ]


def test_an_unexpected_error_is_a_problem_500_with_an_id_that_is_in_the_log(
    service, problem, monkeypatch, caplog
):
    monkeypatch.setattr(registry, "list_patterns", _fail)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        response = service.client.get("/v1/patterns")
    body = problem(response, 500, "internal-error")
    assert body["error_id"] and body["error_id"] in _logged_ids(caplog)
    assert "error_id" in body["detail"]  # says what to do: report the id
    # The exception's text (it may carry paths or SQL) stays in the log only.
    assert "secret" not in response.text and "RuntimeError" not in response.text
    record = next(r for r in caplog.records if r.name == LOGGER)
    assert record.exc_info[0] is RuntimeError  # the traceback is logged


def test_each_failure_gets_its_own_id(service, monkeypatch, caplog):
    monkeypatch.setattr(registry, "list_patterns", _fail)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        ids = {service.client.get("/v1/patterns").json()["error_id"] for _ in range(3)}
    assert len(ids) == 3 and ids <= set(_logged_ids(caplog))


def test_the_dashboard_gets_an_html_error_page_with_the_id(service, monkeypatch, caplog):
    monkeypatch.setattr(registry, "list_patterns", _fail)
    with caplog.at_level(logging.ERROR, logger=LOGGER):
        response = service.client.get("/ui/patterns")
    assert response.status_code == 500
    assert response.headers["content-type"].startswith("text/html")
    (error_id,) = _logged_ids(caplog)
    assert f'<code id="error-id">{error_id}</code>' in response.text
    assert "secret" not in response.text
    assert "content-security-policy" in response.headers  # still the dashboard's headers


@contextmanager
def _database_down(url: str) -> Iterator[None]:
    """The database refuses connections and drops the ones it has (as during a
    restart), then comes back."""
    server, name = url.rsplit("/", 1)
    admin = create_engine(f"{server}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false'))
            conn.execute(
                text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :n"),
                {"n": name},
            )
        yield
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true'))
        admin.dispose()


def test_a_database_outage_is_a_503_with_retry_after_then_recovers(
    make_service, postgres_url, problem, caplog
):
    service = make_service(database_url=postgres_url)
    client = service.client
    assert client.get("/v1/patterns").status_code == 200
    with _database_down(postgres_url), caplog.at_level(logging.ERROR, logger=LOGGER):
        for path in ("/v1/patterns", "/v1/strategies", "/v1/jobs"):
            response = client.get(path)
            body = problem(response, 503, "database-unavailable")
            assert response.headers["retry-after"] == str(DATABASE_RETRY_AFTER_S)
            assert body["error_id"] in _logged_ids(caplog)
        page = client.get("/ui/patterns")
        assert page.status_code == 503 and page.headers["content-type"].startswith("text/html")
        assert page.headers["retry-after"] == str(DATABASE_RETRY_AFTER_S)
    assert client.get("/v1/patterns").status_code == 200  # no restart needed


def test_a_formula_of_2000_terms_is_a_422_naming_the_limit(service, problem):
    spec = {
        "name": "acme.long_formula",
        "nodes": [{"id": "m", "op": "Mul"}],
        "constraints": [{"kind": "formula", "value": "m.in1", "equals": "+".join(["1"] * 2000)}],
        "rewriter": {"name": "fused_region", "params": {"domain": "ai.acme"}},
    }
    body = problem(service.client.post("/v1/patterns", json=spec), 422, "invalid-pattern")
    assert "at most 500" in body["detail"], body
