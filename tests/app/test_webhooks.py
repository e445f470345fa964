"""Webhooks (issue 27): a job that ends POSTs its summary to its callback URL, signed as
the Standard Webhooks specification says, retried with backoff, every attempt logged;
only to hosts the operator allows.

The receiver is a real HTTP server on 127.0.0.1; the signature is checked with the
standard library alone (``verify`` below), not with the code that signed it. The
delivery pass (``deliver_due``) is the one the worker's reaper runs, driven here with a
clock of the test's own; the last test runs it for real in ``autofusion serve``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from autofusion.app.core.config import Settings
from autofusion.app.services.webhooks import deliver_due
from tests.app.cli_server import FAST_POLL, Server, run_cli
from tests.app.conftest import relu_model

SERVER_SECRET = "whsec_" + base64.b64encode(b"s" * 32).decode()


class Receiver:
    """An HTTP server on 127.0.0.1 that records each POST and answers the next status of
    ``statuses`` (the last one repeats)."""

    def __init__(self, statuses: list[int] | None = None, location: str = "") -> None:
        self.statuses = list(statuses or [204])
        self.posts: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                receiver.posts.append(({k.lower(): v for k, v in self.headers.items()}, body))
                status = (
                    receiver.statuses.pop(0) if len(receiver.statuses) > 1 else receiver.statuses[0]
                )
                self.send_response(status)
                if location:
                    self.send_header("location", location)
                self.send_header("content-length", "0")
                self.end_headers()

            def log_message(self, *args) -> None:  # quiet test output
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def verify(secret: str, headers: dict[str, str], body: bytes) -> dict:
    """The receiver's check, as docs/service.md shows it: HMAC-SHA256 of
    "{webhook-id}.{webhook-timestamp}.{body}" keyed with the secret's base64 part."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    offered = [s.removeprefix("v1,") for s in headers["webhook-signature"].split()]
    assert any(hmac.compare_digest(expected, s) for s in offered), "signature does not verify"
    assert abs(time.time() - int(headers["webhook-timestamp"])) < 300
    return json.loads(body)


def _on(service, **overrides) -> Settings:
    """The service's settings with some changed (a delivery pass reads only these)."""
    return service.settings.model_copy(update=overrides)


def _submit(service, model: bytes, url: str | None) -> str:
    config = {"callback_url": url} if url is not None else {}
    answer = service.submit(model, config=config)
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def _log(service, job_id: str) -> dict:
    answer = service.client.get(f"/v1/jobs/{job_id}/webhooks")
    assert answer.status_code == 200, answer.text
    return answer.json()


def _database(database: str, request) -> dict:
    if database == "postgresql":
        return {"database_url": request.getfixturevalue("postgres_url")}
    return {}


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_job_that_ends_posts_its_signed_summary_once(
    make_service, receiver, tiny_model, database, request
):
    service = make_service(webhook_allowed_hosts=["127.0.0.1"], **_database(database, request))
    job_id = _submit(service, tiny_model, receiver.url)
    assert "callback_url" not in service.client.get(f"/v1/jobs/{job_id}").json()["config"]
    assert _log(service, job_id)["state"] == "waiting"
    assert "sent when the job ends" in service.client.get(f"/ui/jobs/{job_id}").text
    assert deliver_due(service.settings) == [] and receiver.posts == []  # not ended yet

    speed = {"level": "all", "ratio": 0.8, "speedup": 1.25, "verdict": "faster"}
    service.succeed(job_id, b"fused", {"report": 1}, {"fusions": 3, "speed": speed})
    [attempt] = deliver_due(service.settings)
    assert attempt.delivered and attempt.status_code == 204
    assert deliver_due(service.settings) == []  # delivered: never again

    [(headers, body)] = receiver.posts
    secret = service.client.get("/v1/webhooks").json()["secret"]
    payload = verify(secret, headers, body)
    assert headers["content-type"] == "application/json"
    assert payload["type"] == "job.succeeded"
    data = payload["data"]
    assert (data["id"], data["status"], data["fusions"]) == (job_id, "succeeded", 3)
    assert (data["verdict"], data["speedup"]) == ("faster", 1.25)
    assert data["links"]["model"] == f"http://testserver/v1/jobs/{job_id}/model"

    log = _log(service, job_id)
    assert log["state"] == "delivered" and log["message_id"] == headers["webhook-id"]
    [entry] = log["deliveries"]
    assert entry["attempt"] == 1 and entry["status_code"] == 204 and entry["error"] is None


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_delivery_passes_at_once_in_several_workers_send_each_webhook_once(
    make_service, receiver, tiny_model, database, request
):
    service = make_service(webhook_allowed_hosts=["127.0.0.1"], **_database(database, request))
    jobs = [
        _submit(service, relu_model(width).SerializeToString(), receiver.url) for width in (2, 3, 5)
    ]
    for job_id in jobs:
        service.client.post(f"/v1/jobs/{job_id}/cancel")
    barrier = threading.Barrier(4)
    made: list = []

    def worker() -> None:
        barrier.wait()
        made.extend(deliver_due(service.settings))

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(a.job_id for a in made) == sorted(jobs)  # each claimed by one pass
    assert sorted(json.loads(body)["data"]["id"] for _, body in receiver.posts) == sorted(jobs)
    secret = service.client.get("/v1/webhooks").json()["secret"]
    for headers, body in receiver.posts:  # one tenant secret, made once, signs them all
        verify(secret, headers, body)


def test_a_failing_receiver_is_retried_with_backoff_and_each_attempt_logged(
    make_service, tiny_model
):
    failing = Receiver([500])
    try:
        service = make_service(
            webhook_allowed_hosts=["127.0.0.1"], webhook_max_attempts=3, webhook_retry_s=10
        )
        job_id = _submit(service, tiny_model, failing.url)
        assert service.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
        t0 = datetime.now(UTC)
        at = {"now": t0}

        def run(offset_s: float) -> list:
            at["now"] = t0 + timedelta(seconds=offset_s)
            return deliver_due(service.settings, clock=lambda: at["now"])

        [first] = run(0)
        assert first.status_code == 500 and first.next_attempt_at == t0 + timedelta(seconds=10)
        assert run(9) == []  # not due yet
        [second] = run(10)
        assert second.next_attempt_at == t0 + timedelta(seconds=30)  # 10 s, then 20 s
        assert run(29) == []
        [third] = run(30)
        assert third.next_attempt_at is None  # the last of webhook_max_attempts
        assert run(3600) == []
    finally:
        failing.close()

    assert len(failing.posts) == 3
    assert len({headers["webhook-id"] for headers, _ in failing.posts}) == 1  # one message
    log = _log(service, job_id)
    assert log["state"] == "failed"
    assert [(d["attempt"], d["status_code"], d["error"]) for d in log["deliveries"]] == [
        (n, 500, "answered 500") for n in (1, 2, 3)
    ]
    nexts = [d["next_attempt_at"] for d in log["deliveries"]]
    assert nexts[0] and nexts[1] and nexts[2] is None

    page = service.client.get(f"/ui/jobs/{job_id}")  # the dashboard shows the same log
    assert page.status_code == 200 and 'data-state="failed"' in page.text
    assert page.text.count("answered 500") == 3 and failing.url in page.text


def test_a_host_the_operator_does_not_allow_is_refused_with_422(make_service, tiny_model, problem):
    service = make_service(webhook_allowed_hosts=["ci.example.com:8443", "*.example.org"])
    for url, why in [
        ("https://evil.example.net/hook", "not one this server calls back"),
        ("https://ci.example.com/hook", "(port 443) is not one"),  # another port
        ("ftp://ci.example.com:8443/hook", "http or https"),
        ("https://user:pw@a.example.org/hook", "credentials"),
    ]:
        body = problem(
            service.submit(tiny_model, config={"callback_url": url}), 422, "invalid-config"
        )
        assert body["errors"][0]["field"] == "config.callback_url"
        assert why in body["detail"], body["detail"]
        if "not one" in why:  # says what to do: which setting allows the host
            assert "AUTOFUSION_WEBHOOK_ALLOWED_HOSTS" in body["detail"]
    assert service.job_count() == 0
    for url in ("https://ci.example.com:8443/hook", "https://a.b.example.org/hook"):
        assert service.submit(tiny_model, config={"callback_url": url}).status_code == 202

    answer = service.client.put("/v1/webhooks", json={"default_url": "https://evil.example.net/"})
    assert problem(answer, 422, "invalid-request")["errors"][0]["field"] == "default_url"


def test_a_server_without_allowed_hosts_says_which_setting_turns_webhooks_on(
    make_service, tiny_model, problem
):
    service = make_service()
    answer = service.submit(tiny_model, config={"callback_url": "http://127.0.0.1:9/hook"})
    body = problem(answer, 422, "invalid-config")
    assert "webhooks are off" in body["detail"]
    assert "AUTOFUSION_WEBHOOK_ALLOWED_HOSTS" in body["detail"]


def test_a_keyless_server_signs_with_the_server_wide_secret(make_service, receiver, tiny_model):
    service = make_service(webhook_allowed_hosts=["127.0.0.1"], webhook_secret=SERVER_SECRET)
    settings = service.client.get("/v1/webhooks").json()
    assert settings["signed_with"] == "server" and settings["secret"] is None
    job_id = _submit(service, tiny_model, receiver.url)
    service.client.post(f"/v1/jobs/{job_id}/cancel")
    [attempt] = deliver_due(service.settings)
    assert attempt.delivered
    [(headers, body)] = receiver.posts
    payload = verify(SERVER_SECRET, headers, body)
    assert payload["type"] == "job.cancelled" and payload["data"]["status"] == "cancelled"


def test_the_tenant_default_url_and_a_rotated_secret(make_service, receiver, tiny_model):
    service = make_service(webhook_allowed_hosts=["127.0.0.1"])
    answer = service.client.put("/v1/webhooks", json={"default_url": receiver.url})
    assert answer.status_code == 200 and answer.json()["default_url"] == receiver.url
    old = answer.json()["secret"]
    assert old.startswith("whsec_")
    new = service.client.post("/v1/webhooks/secret").json()["secret"]
    assert new != old and service.client.get("/v1/webhooks").json()["secret"] == new

    job_id = _submit(service, tiny_model, None)  # no callback_url: the tenant's default
    service.update_job(job_id, status="failed", stage="failed", error="boom", error_type="crashed")
    deliver_due(service.settings)
    [(headers, body)] = receiver.posts
    payload = verify(new, headers, body)
    assert payload["type"] == "job.failed"
    assert payload["data"]["error"]["type"].endswith("/crashed")
    with pytest.raises(AssertionError, match="does not verify"):
        verify(old, headers, body)


def test_the_host_is_checked_again_at_delivery_and_redirects_are_not_followed(
    make_service, receiver, tiny_model
):
    service = make_service(webhook_allowed_hosts=["127.0.0.1"])
    job_id = _submit(service, tiny_model, receiver.url)
    service.client.post(f"/v1/jobs/{job_id}/cancel")
    [attempt] = deliver_due(_on(service, webhook_allowed_hosts=["ci.example.com"]))
    assert attempt.error.startswith("not sent:") and attempt.next_attempt_at is None
    assert receiver.posts == [] and _log(service, job_id)["state"] == "failed"

    redirecting = Receiver([302], location=receiver.url)
    try:
        job_id = _submit(service, tiny_model, redirecting.url)
        service.client.post(f"/v1/jobs/{job_id}/cancel")
        [attempt] = deliver_due(service.settings)
    finally:
        redirecting.close()
    assert attempt.status_code == 302 and "not followed" in attempt.error
    assert len(redirecting.posts) == 1 and receiver.posts == []


def test_a_receiver_that_does_not_answer_is_an_attempt_that_timed_out(make_service, tiny_model):
    service = make_service(webhook_allowed_hosts=["127.0.0.1"], webhook_timeout_s=0.5)
    with socket.socket() as silent:  # accepts the connection, never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/hook"
        job_id = _submit(service, tiny_model, url)
        service.client.post(f"/v1/jobs/{job_id}/cancel")
        started = time.monotonic()
        [attempt] = deliver_due(service.settings)
    assert time.monotonic() - started < 5
    assert attempt.status_code is None and "no answer within 0.5 s" in attempt.error
    assert attempt.next_attempt_at is not None


def test_settings_read_hosts_from_the_environment_and_check_the_secret(monkeypatch):
    monkeypatch.setenv("AUTOFUSION_WEBHOOK_ALLOWED_HOSTS", "CI.example.com, 127.0.0.1:8080")
    assert Settings().webhook_allowed_hosts == ["ci.example.com", "127.0.0.1:8080"]
    monkeypatch.setenv("AUTOFUSION_WEBHOOK_ALLOWED_HOSTS", '["a.example.com"]')
    assert Settings().webhook_allowed_hosts == ["a.example.com"]
    monkeypatch.setenv("AUTOFUSION_WEBHOOK_SECRET", "not-a-secret")
    with pytest.raises(ValueError, match="whsec_"):
        Settings()


def test_the_standard_webhooks_test_vector():
    """The signature scheme against the specification's published example, so that the
    independent ``verify`` above is checked too."""
    from autofusion.app.services.webhooks import sign_headers

    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
    body = b'{"test": 2432232314}'
    sent = datetime.fromtimestamp(1614265330, UTC)
    headers = sign_headers("msg_p5jXN8AQM9LWM0D4loKWxJek", body, secret, sent)
    assert headers["webhook-signature"] == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = b"msg_p5jXN8AQM9LWM0D4loKWxJek.1614265330." + body
    assert hmac.new(key, signed, hashlib.sha256).digest() == base64.b64decode(
        headers["webhook-signature"].removeprefix("v1,")
    )


@pytest.mark.slow
def test_a_live_server_calls_back_when_a_submitted_job_ends(tmp_path, receiver, capsys):
    """``autofusion serve`` (the embedded worker and its reaper) and ``autofusion
    submit --callback-url``: the job runs, ends, and the receiver gets one signed POST."""
    env = {
        **FAST_POLL,
        "AUTOFUSION_WEBHOOK_ALLOWED_HOSTS": "127.0.0.1",
        "AUTOFUSION_WEBHOOK_SECRET": SERVER_SECRET,
        "AUTOFUSION_WEBHOOK_POLL_S": "0.2",
    }
    server = Server(tmp_path / "data", env=env)
    try:
        server.wait_healthy()
        model = tmp_path / "relu.onnx"
        model.write_bytes(relu_model().SerializeToString())
        code, out, err = run_cli(
            capsys, "submit", model, "--server", server.url, "--callback-url", receiver.url
        )
        assert code == 0, err
        deadline = time.monotonic() + 120
        while not receiver.posts and time.monotonic() < deadline:
            time.sleep(0.2)
        [(headers, body)] = receiver.posts
        payload = verify(SERVER_SECRET, headers, body)
        job = httpx.get(f"{server.url}/v1/jobs/{payload['data']['id']}", timeout=5).json()
        assert payload["data"]["status"] == job["status"] == "succeeded"
        log = httpx.get(f"{server.url}/v1/jobs/{job['id']}/webhooks", timeout=5).json()
        assert log["state"] == "delivered" and len(log["deliveries"]) == 1
    finally:
        server.stop()


def test_the_admin_cli_prints_rotates_and_sets_a_tenants_webhook(tmp_path, capsys, monkeypatch):
    for name in ("AUTOFUSION_WEBHOOK_ALLOWED_HOSTS", "AUTOFUSION_WEBHOOK_SECRET"):
        monkeypatch.delenv(name, raising=False)
    data = ["--tenant", "ci", "--data-dir", str(tmp_path / "data")]
    code, first, _ = run_cli(capsys, "keys", "webhook", *data)
    assert code == 0 and first.strip().startswith("whsec_")
    assert run_cli(capsys, "keys", "webhook", *data)[1] == first  # kept, not made again
    code, rotated, _ = run_cli(capsys, "keys", "webhook", *data, "--rotate")
    assert code == 0 and rotated.strip().startswith("whsec_") and rotated != first

    code, out, err = run_cli(capsys, "keys", "webhook", *data, "--url", "https://ci.example.com/")
    assert code == 2 and out == "" and "AUTOFUSION_WEBHOOK_ALLOWED_HOSTS" in err
    monkeypatch.setenv("AUTOFUSION_WEBHOOK_ALLOWED_HOSTS", "ci.example.com")
    code, out, err = run_cli(capsys, "keys", "webhook", *data, "--url", "https://ci.example.com/")
    assert code == 0 and out == rotated and "https://ci.example.com/" in err
