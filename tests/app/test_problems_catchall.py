"""One catch-all problem handler (issue 15, item 4; app/api/problems.py).

No text/plain 500 anywhere: an exception no handler knows is a problem+json 500 whose
``error_id`` is also in the log line (with the traceback), the dashboard gets an HTML
page with the id, and a database outage is a 503 with Retry-After. Before, each of
these answered Starlette's bare ``Internal Server Error`` in text/plain (or raised out
of the app).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text

from autofusion.app.api.deps import get_settings_dep
from autofusion.app.api.problems import DATABASE_RETRY_AFTER_S
from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.models import Job
from autofusion.app.main import create_app
from autofusion.app.services import registry
from autofusion.app.services.auth import create_key
from tests.app.conftest import PROBLEM_BASE, PROBLEM_JSON, relu_model

LOGGER = "autofusion.app.api.problems"


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


# --- every route and method (issue 18) ------------------------------------------------
# Walks app.routes and provokes the errors a client can cause on each: unknown ids, bad
# bodies, bad query and header values, integers no column holds, a wrong method, no key.
# Each error must be problem+json with type, title, status and detail; none a 5xx.

UNKNOWN = {
    "job_id": "00000000-0000-4000-8000-000000000000",
    "name": "acme.no_such_thing",
    "version": "999",
    "what": "report",
}
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Integers no column holds (SQLite's INTEGER is 64-bit, PostgreSQL's 32), and others.
BAD_INTEGERS = ("1" * 30, "-1", "-" + "9" * 25, "abc", "1.5", "")
BAD_STRINGS = ("", "x" * 5000, "\u00b2", "../../etc/passwd", "' OR 1=1 --")


@dataclass
class Operation:
    path: str
    method: str
    params: list[dict]  # the OpenAPI parameters (in: path, query, header)
    public: bool  # answers without an API key

    def url(self, **values: str) -> str:
        def fill(match: re.Match) -> str:
            return values.get(match.group(1), UNKNOWN.get(match.group(1), "nope"))

        return re.sub(r"\{(\w+)\}", fill, self.path)

    def of(self, where: str) -> list[dict]:
        return [p for p in self.params if p["in"] == where]


def api_operations(app) -> list[Operation]:
    """Every method of every route outside the dashboard, from ``app.routes`` (included
    routers flattened), with its parameters from the OpenAPI document."""
    document = app.openapi()
    operations = []
    for route in iter_route_contexts(app.routes):
        path, methods = route.path, route.methods
        if not path or not methods or path == "/" or path.startswith("/ui"):
            continue
        for method in sorted(methods - {"HEAD"}):
            op = document["paths"].get(path, {}).get(method.lower(), {})
            operations.append(Operation(path, method, op.get("parameters", []), path in PUBLIC))
    return operations


# Answered without an API key: the probes, the metrics and the documentation.
PUBLIC = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/docs", "/docs/oauth2-redirect"}
PUBLIC |= {"/redoc"}


@dataclass
class Walk:
    client: TestClient
    secured: TestClient
    key: str
    operations: list[Operation]
    existing: dict[str, str]  # path values of resources that exist (a cancelled job)

    def urls(self, op: Operation) -> list[str]:
        """The operation's URL with unknown ids, then with existing ones."""
        name = "conv_bn" if op.path.startswith("/v1/patterns") else "vision"
        if op.path.endswith("/artifacts/{name}"):
            name = "report.html"
        return list(dict.fromkeys([op.url(), op.url(name=name, **self.existing)]))


@pytest.fixture(scope="module")
def walk(tmp_path_factory) -> Iterator[Walk]:
    base = tmp_path_factory.mktemp("walk")
    # No worker runs here: /readyz's worker check off, so its 503 is no answer to walk.
    quiet = {"embedded_worker": False, "readyz_requires_worker": False}
    open_app = create_app(Settings(data_dir=base / "open", **quiet))
    secured_app = create_app(Settings(data_dir=base / "secured", require_api_keys=True, **quiet))
    with TestClient(open_app) as client, TestClient(secured_app) as secured:
        open_app.state.enqueue = secured_app.state.enqueue = lambda job_id: None
        with session_scope(secured_app.state.settings.resolved_database_url) as session:
            key = create_key(session, "tenant-walk", ["jobs:write", "patterns:write"])
        files = {"model": ("m.onnx", relu_model().SerializeToString())}
        job_id = client.post("/v1/optimize", files=files).json()["id"]
        client.post(f"/v1/jobs/{job_id}/cancel")  # final: its event stream ends at once
        existing = {"job_id": job_id, "version": "1"}
        yield Walk(client, secured, key, api_operations(open_app), existing)


def assert_problem_answer(response, must_fail: bool = True) -> None:
    """An error is problem+json with type, title, status, detail; never a 5xx here."""
    where = f"{response.request.method} {response.request.url}"
    assert response.status_code < 500, (where, response.status_code, response.text[:500])
    if response.status_code < 400:
        assert not must_fail, (where, response.status_code, response.text[:300])
        return
    content_type = response.headers.get("content-type", "")
    assert content_type.startswith(PROBLEM_JSON), (where, content_type, response.text[:300])
    body = response.json()
    for member, kind in (("type", str), ("title", str), ("status", int), ("detail", str)):
        assert isinstance(body.get(member), kind) and body[member] != "", (where, member, body)
    assert body["type"].startswith(PROBLEM_BASE), (where, body)
    assert body["status"] == response.status_code, (where, body)
    assert "Traceback" not in response.text and 'File "' not in response.text, where


def test_the_walk_covers_every_api_route(walk):
    paths = {op.path for op in walk.operations}
    assert {"/v1/optimize", "/v1/jobs", "/v1/jobs/{job_id}", "/v1/patterns/{name}"} <= paths
    assert len(walk.operations) >= 25, [(op.method, op.path) for op in walk.operations]


def _send(client: TestClient, method: str, url: str, **kwargs):
    return client.request(method, url, **kwargs)


def test_every_route_answers_unknown_ids_with_a_problem(walk):
    for op in walk.operations:
        if "{" not in op.path:
            continue
        assert_problem_answer(_send(walk.client, op.method, op.url()))


def test_every_route_answers_bad_bodies_with_a_problem(walk):
    bodies = [
        {"content": b"{not json", "headers": {"Content-Type": "application/json"}},
        {"content": b"[1, 2, 3]", "headers": {"Content-Type": "application/json"}},
        {"content": b"\x00\xff" * 64, "headers": {"Content-Type": "multipart/form-data"}},
        {"content": b"--x\r\n", "headers": {"Content-Type": "multipart/form-data; boundary=x"}},
        {"content": b"model=1", "headers": {"Content-Type": "text/plain"}},
    ]
    for op in walk.operations:
        if op.method not in ("POST", "PUT"):
            continue
        for body in bodies:
            # Existing resources too (a built-in pattern), where the body decides.
            for url in walk.urls(op):
                response = _send(walk.client, op.method, url, **body)
                # enable, disable and the secret's rotation take no body: on a pattern
                # that exists, and for any tenant, they work whatever is sent.
                no_body = op.path.endswith(("able", "/webhooks/secret"))
                assert_problem_answer(response, must_fail=not no_body)


def test_every_route_answers_bad_query_and_header_values_with_a_problem(walk):
    for op in walk.operations:
        for param in op.of("query") + op.of("header"):
            schema = param.get("schema", {})
            integer = "integer" in json.dumps(schema)
            values = BAD_INTEGERS if integer else BAD_STRINGS
            for value, url in itertools.product(values, walk.urls(op)):
                if param["in"] == "query":
                    response = _send(walk.client, op.method, url, params={param["name"]: value})
                else:  # as bytes: a header is latin-1 on the wire
                    headers = {param["name"]: value.encode("latin-1")}
                    response = _send(walk.client, op.method, url, headers=headers)
                assert_problem_answer(response, must_fail=False)
                if integer and param["in"] == "query" and "{" not in op.path:
                    assert response.status_code in (400, 422), (op.path, param["name"], value)


def test_every_integer_path_parameter_is_bounded(walk):
    for op in walk.operations:
        for param in op.of("path"):
            if "integer" not in json.dumps(param.get("schema", {})):
                continue
            for value in BAD_INTEGERS[:-1]:
                url = op.url(**{**walk.existing, "name": "conv_bn", param["name"]: value})
                assert_problem_answer(_send(walk.client, op.method, url))


def test_every_path_answers_a_wrong_method_with_a_405_problem(walk):
    allowed: dict[str, set[str]] = {}
    for op in walk.operations:
        allowed.setdefault(op.path, set()).add(op.method)
    routes = iter_route_contexts(walk.client.app.routes)
    heads = {route.path for route in routes if "HEAD" in (route.methods or ())}
    for path, methods in allowed.items():
        url = Operation(path, "GET", [], False).url()
        for method in sorted({*METHODS, "OPTIONS", "TRACE"} - methods):
            response = _send(walk.client, method, url)
            assert_problem_answer(response)
            assert response.status_code == 405, (method, path, response.status_code)
            assert set(response.headers["allow"].replace(" ", "").split(",")) >= methods
        if path not in heads:  # no body to read: the status and the media type
            head = _send(walk.client, "HEAD", url)
            assert head.status_code in (405, 404), (path, head.status_code)
            assert head.headers["content-type"].startswith(PROBLEM_JSON), (path, head.headers)


def test_every_route_answers_a_missing_or_wrong_key_with_a_401_problem(walk):
    for op in walk.operations:
        if op.public:
            continue
        wrong = ({}, {"Authorization": "Bearer af_wrong"}, {"X-API-Key": b"\xb2"})
        for headers in wrong:
            response = _send(walk.secured, op.method, op.url(), headers=headers)
            assert_problem_answer(response)
            assert response.status_code == 401, (op.method, op.path, response.status_code)
            assert response.headers["www-authenticate"].startswith("Bearer")


def test_unknown_paths_are_404_problems(walk):
    for path in ("/nope", "/v1", "/v1/jobs/x/y/z", "/v2/jobs", "/v1/patterns/a/versions/1/x"):
        for method in METHODS:
            response = _send(walk.client, method, path)
            assert_problem_answer(response)
            assert response.status_code in (404, 405), (method, path)


def test_an_unexpected_error_on_any_route_is_a_500_problem_without_internals(walk, caplog):
    """Every route that takes the settings (all but /healthz and the docs) fails inside:
    a problem+json 500 internal-error with an error_id, the text of the error nowhere."""
    app = walk.client.app

    async def broken() -> Settings:
        raise RuntimeError("a bug: secret path /srv/internal/thing")

    app.dependency_overrides[get_settings_dep] = broken
    failed = set()
    try:
        with caplog.at_level(logging.ERROR, logger=LOGGER):
            for op in walk.operations:
                response = _send(walk.client, op.method, walk.urls(op)[-1])
                if response.status_code == 500:
                    body = response.json()
                    assert response.headers["content-type"].startswith(PROBLEM_JSON)
                    assert body["type"] == PROBLEM_BASE + "internal-error", body
                    assert body["title"] and body["detail"] and body["error_id"]
                    assert "secret" not in response.text and "RuntimeError" not in response.text
                    failed.add(op.path)
                else:
                    assert_problem_answer(response, must_fail=False)
    finally:
        app.dependency_overrides.clear()
    assert {op.path for op in walk.operations} - failed <= PUBLIC, failed


async def _raw_request(app, method: str, url: str, headers: list[tuple[bytes, bytes]]):
    """Straight to the ASGI app, header bytes as sent (an HTTP client would encode them)."""
    path, _, query = url.removeprefix("http://testserver").partition("?")
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(b"host", b"testserver"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
        "app": app,
    }
    sent: list[dict] = []
    requested = False

    async def receive() -> dict:
        nonlocal requested
        if not requested:
            requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        sent.append(message)

    with contextlib.suppress(Exception):  # ServerErrorMiddleware re-raises after answering
        await app(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    headers = {k.decode(): v.decode("latin-1") for k, v in start["headers"]}
    return start["status"], headers, body


def test_header_bytes_no_client_would_send_are_still_answered_with_problems(walk):
    """Latin-1 bytes in every header a route reads, and in Content-Length (a digit to
    str.isdigit, not to int), sent as raw ASGI: 4xx problems or success, never a 500."""
    app = walk.client.app
    for op in walk.operations:
        names = [p["name"].lower() for p in op.of("header")] + ["content-length"]
        values = (b"\xb2", b"\xff\xfe", b"1" * 40)
        for name, value, url in itertools.product(names, values, walk.urls(op)):
            status, headers, body = walk.client.portal.call(
                _raw_request, app, op.method, url, [(name.encode(), value)]
            )
            where = (op.method, url, name, value, status, body[:300])
            assert status < 500, where
            if status >= 400:
                assert headers["content-type"].startswith(PROBLEM_JSON), where
                assert {"type", "title", "status", "detail"} <= set(json.loads(body)), where


def test_the_dashboard_answers_its_errors_as_html_pages(walk):
    """Under /ui an error is the dashboard's HTML page (never text/plain, no traceback):
    unknown ids, wrong methods, bad values, and a cross-site form post."""
    ui = [
        r for r in iter_route_contexts(walk.client.app.routes) if (r.path or "").startswith("/ui")
    ]
    for path in dict.fromkeys(route.path for route in ui):
        url = Operation(path, "GET", [], False).url(version="1" * 30)
        for method in METHODS:
            response = _send(walk.client, method, url, follow_redirects=False)
            where = (method, url, response.status_code, response.text[:200])
            assert response.status_code < 500, where
            if response.status_code >= 400:
                assert response.headers["content-type"].startswith("text/html"), where
                # the error page, or a form shown again with its errors
                assert "<html" in response.text and "Traceback" not in response.text, where
    cross_site = {"Sec-Fetch-Site": "cross-site"}
    response = walk.client.post("/ui/patterns/new", headers=cross_site, follow_redirects=False)
    assert response.status_code == 403
    assert response.headers["content-type"].startswith("text/html"), response.headers


def test_an_error_a_component_answers_in_its_own_words_is_still_a_problem(walk):
    """A bad Range on a download: Starlette's FileResponse answers a text/plain 416 or
    400 itself; it leaves as a problem of that status, its Content-Range kept."""
    client, store = walk.client, walk.client.app.state.store
    files = {"model": ("m.onnx", relu_model().SerializeToString())}
    job_id = client.post("/v1/optimize", files=files).json()["id"]
    with session_scope(client.app.state.settings.resolved_database_url) as session:
        job = session.get(Job, job_id)
        job.status, job.stage, job.revision = "succeeded", "succeeded", job.revision + 1
        job.fused_digest = store.put_bytes(b"0123456789" * 10)
        job.report_digest = store.put_bytes(b"{}")
    for value in ("bytes=abc", "bytes=500-600", "bytes=5-2", "pages=1-2", "bytes=" + "1-2," * 500):
        response = client.get(f"/v1/jobs/{job_id}/model", headers={"Range": value})
        assert_problem_answer(response, must_fail=False)
        if response.status_code == 416:
            assert response.headers["content-range"] == "bytes */100"
            assert response.json()["type"] == PROBLEM_BASE + "range-not-satisfiable"
    ok = client.get(f"/v1/jobs/{job_id}/model", headers={"Range": "bytes=0-9"})
    assert ok.status_code == 206 and ok.content == b"0123456789"  # a good range still works
