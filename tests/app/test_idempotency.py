"""An Idempotency-Key in use (app/services/idempotency.py): while the first request with
a key is still uploading, a second one is a 409 problem with Retry-After; once the job
exists, the key replays it as before. Against a real uvicorn server, the first upload
held half-way in a thread. Before: the second request was taken in, both uploads ran,
and whichever finished second was answered with the other's job or a 500.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import httpx
import pytest

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.models import IdempotencyReservation, Job, utcnow
from autofusion.app.services.auth import ensure_tenant
from tests.app.conftest import relu_model
from tests.app.test_races import _serve

BOUNDARY = "idempotency-test-boundary"


def _body(model: bytes) -> tuple[bytes, bytes]:
    """A multipart body with one model part, cut in two halves."""
    head = (
        f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="model"; '
        f'filename="m.onnx"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    whole = head + model + f"\r\n--{BOUNDARY}--\r\n".encode()
    return whole[: len(whole) // 2], whole[len(whole) // 2 :]


HEADERS = {"Content-Type": f"multipart/form-data; boundary={BOUNDARY}"}


@pytest.fixture(params=["sqlite", "postgresql"])
def server(request, tmp_path) -> Iterator[tuple[str, Settings]]:
    database_url = ""
    if request.param == "postgresql":
        database_url = request.getfixturevalue("postgres_url")
    settings = Settings(
        data_dir=tmp_path / "data", embedded_worker=False, database_url=database_url
    )
    for url in _serve(settings):
        yield url, settings


def _reservations(settings: Settings) -> list[IdempotencyReservation]:
    with session_scope(settings.resolved_database_url) as session:
        rows = session.query(IdempotencyReservation).all()
        session.expunge_all()
        return rows


def _post(url: str, content, key: str) -> httpx.Response:
    headers = {**HEADERS, "Idempotency-Key": key}
    return httpx.post(f"{url}/v1/optimize", content=content, headers=headers, timeout=60)


def test_a_second_request_while_the_first_uploads_is_a_409_then_the_key_replays(server, problem):
    url, settings = server
    first_half, second_half = _body(relu_model().SerializeToString())
    release, answers = threading.Event(), {}

    def slow_body() -> Iterator[bytes]:
        yield first_half
        release.wait(30)  # the upload stalls half-way (well within the body's rate limit)
        yield second_half

    slow = threading.Thread(target=lambda: answers.update(first=_post(url, slow_body(), "k1")))
    slow.start()
    try:
        deadline = time.monotonic() + 30
        while not _reservations(settings):
            assert time.monotonic() < deadline, "the first request never reserved its key"
            time.sleep(0.05)
        during = _post(url, first_half + second_half, "k1")
        body = problem(during, 409, "idempotency-key-in-use")
        assert during.headers["retry-after"] == str(settings.retry_after_s)
        assert "k1" in body["detail"]
        # Another key is not held up.
        assert _post(url, first_half + second_half, "k2").status_code == 202
    finally:
        release.set()
        slow.join(60)
    first = answers["first"]
    assert first.status_code == 202, first.text
    assert _reservations(settings) == []  # removed once the request ended
    replay = _post(url, first_half + second_half, "k1")
    assert replay.status_code == 202 and replay.headers["idempotent-replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"]


def test_a_failed_upload_frees_its_key(server, problem):
    url, settings = server
    problem(_post(url, b"--nope--", "k3"), 422, "invalid-upload")
    assert _reservations(settings) == []
    first_half, second_half = _body(relu_model().SerializeToString())
    assert _post(url, first_half + second_half, "k3").status_code == 202


def test_a_reservation_left_by_a_killed_server_is_taken_over_once_stale(service, tiny_model):
    with service.db() as session:
        ensure_tenant(session, "default")
        long_ago = utcnow() - timedelta(days=1)
        session.add(
            IdempotencyReservation(
                tenant_id="default", key="old", token=str(uuid.uuid4()), started_at=long_ago
            )
        )
        session.add(IdempotencyReservation(tenant_id="default", key="new", token="t"))
    assert service.submit(tiny_model, headers={"Idempotency-Key": "old"}).status_code == 202
    held = service.submit(tiny_model, headers={"Idempotency-Key": "new"})
    assert held.status_code == 409 and held.headers["retry-after"]
    assert [r.key for r in _reservations(service.settings)] == ["new"]


def test_the_cli_client_waits_out_a_key_in_use_then_gets_the_job(monkeypatch):
    """autofusion submit's upload: a 409 idempotency-key-in-use (its own earlier try, still
    being received) is retried after Retry-After, not reported as a refusal."""
    from autofusion.app.cli._client import Client

    answers = [
        httpx.Response(
            409,
            headers={"Retry-After": "1", "Content-Type": "application/problem+json"},
            json={"type": "https://autofusion.dev/problems/idempotency-key-in-use"},
        ),
        httpx.Response(202, json={"id": "job-1"}),
    ]
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        sent.append(request.headers.get("Idempotency-Key"))
        return answers[len(sent) - 1]

    slept: list[float] = []
    monkeypatch.setattr("autofusion.app.client._http.time.sleep", slept.append)
    client = Client("http://testserver", None)
    client.http = httpx.Client(base_url="http://testserver", transport=httpx.MockTransport(handler))
    response = client.send("POST", "/v1/optimize", headers={"Idempotency-Key": "k"})
    assert response.status_code == 202 and sent == ["k", "k"] and slept == [1.0]


def _make_older(service, job_id: str, age: timedelta) -> None:
    with service.db() as session:
        session.get(Job, job_id).created_at = utcnow() - age


def test_a_key_older_than_its_ttl_makes_a_new_job_and_moves_to_it(make_service, tiny_model):
    """idempotency_key_ttl_s: past it the key is not replayed (issue 27: a day-old result
    handed back as if fresh); within it, it is, and a different request is still a 422."""
    service = make_service(idempotency_key_ttl_s=3600)
    key = {"Idempotency-Key": "ci-step"}
    first = service.submit(tiny_model, headers=key).json()
    _make_older(service, first["id"], timedelta(minutes=59))
    replay = service.submit(tiny_model, headers=key)
    assert replay.json()["id"] == first["id"] and replay.headers["Idempotent-Replayed"] == "true"
    other = service.submit(tiny_model, headers=key, config={"target": "onnxruntime"})
    assert other.status_code == 422, other.text

    _make_older(service, first["id"], timedelta(minutes=61))
    fresh = service.submit(tiny_model, headers=key)
    assert fresh.status_code == 202 and "Idempotent-Replayed" not in fresh.headers
    assert fresh.json()["id"] != first["id"] and service.enqueued[-1] == fresh.json()["id"]
    with service.db() as session:  # the old job stays, without the key
        assert session.get(Job, first["id"]).idempotency_key is None
    again = service.submit(tiny_model, headers=key)  # the key now replays the new job
    assert again.json()["id"] == fresh.json()["id"] and service.job_count() == 2
