"""A webhook's links are absolute URLs a receiver on another host can follow: made from
the server's ``public_url`` when set, else from the address the job was submitted to
(kept with its callback), never a path on this server.

The receiver and the signature check are tests/app/test_webhooks.py's.
"""

from __future__ import annotations

from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st
from ui_testing import multipart

from autofusion.app.core.config import Settings
from autofusion.app.core.models import JobWebhook
from autofusion.app.services.webhooks import absolute_links, deliver_due
from tests.app.test_webhooks import Receiver, verify

# What the TestClient sends a request to: the address a job is submitted to here.
TEST_CLIENT_BASE = "http://testserver"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


def _delivered(service, receiver: Receiver, job_id: str) -> dict:
    """The job succeeds, its webhook goes out; the message's data, signature checked."""
    service.succeed(job_id, b"fused", {"report": 1}, {"fusions": 1})
    [attempt] = deliver_due(service.settings)
    assert attempt.delivered, attempt.error
    [(headers, body)] = receiver.posts
    secret = service.client.get("/v1/webhooks").json()["secret"]
    return verify(secret, headers, body)["data"]


def _submit(service, model: bytes, url: str) -> str:
    answer = service.submit(model, config={"callback_url": url})
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


def _leaves(links: dict) -> list[str]:
    found = []
    for value in links.values():
        found += _leaves(value) if isinstance(value, dict) else [value]
    return [v for v in found if v is not None]


def test_without_public_url_the_links_start_with_the_address_the_job_was_submitted_to(
    make_service, receiver, tiny_model
):
    service = make_service(webhook_allowed_hosts=["127.0.0.1"])
    job_id = _submit(service, tiny_model, receiver.url)
    links = _delivered(service, receiver, job_id)["links"]
    assert links["self"] == f"{TEST_CLIENT_BASE}/v1/jobs/{job_id}"
    assert links["model"] == f"{TEST_CLIENT_BASE}/v1/jobs/{job_id}/model"
    assert links["report"] == f"{TEST_CLIENT_BASE}/v1/jobs/{job_id}/report"
    assert all(urlsplit(link).netloc == "testserver" for link in _leaves(links))
    # the absolute link answers what its path answers
    model = service.client.get(links["model"])
    assert model.status_code == 200 and model.content == b"fused"
    log = service.client.get(f"/v1/jobs/{job_id}/webhooks").json()
    assert log["links_base"] == TEST_CLIENT_BASE


def test_public_url_wins_over_the_request_address_with_its_path_prefix(
    make_service, receiver, tiny_model
):
    public = "https://autofusion.example.com/fusion"
    service = make_service(webhook_allowed_hosts=["127.0.0.1"], public_url=public + "/")
    assert service.settings.public_url == public  # the trailing slash dropped
    job_id = _submit(service, tiny_model, receiver.url)
    links = _delivered(service, receiver, job_id)["links"]
    assert links["self"] == f"{public}/v1/jobs/{job_id}"
    assert links["events"] == f"{public}/v1/jobs/{job_id}/events"
    assert all(link.startswith(f"{public}/v1/jobs/{job_id}") for link in _leaves(links))
    assert service.client.get(f"/v1/jobs/{job_id}/webhooks").json()["links_base"] == public


def test_a_callback_kept_without_an_address_sends_null_links_not_paths(
    make_service, receiver, tiny_model
):
    """A callback attached before the server kept the address (migration 0012), on a
    server with no public_url: no link it can make is absolute, so none is sent."""
    service = make_service(webhook_allowed_hosts=["127.0.0.1"])
    job_id = _submit(service, tiny_model, receiver.url)
    with service.db() as session:
        session.get(JobWebhook, job_id).base_url = None
    assert service.client.get(f"/v1/jobs/{job_id}/webhooks").json()["links_base"] is None
    data = _delivered(service, receiver, job_id)
    assert data["links"] is None and data["id"] == job_id


def test_a_dashboard_submission_to_the_tenant_default_url_gets_absolute_links(
    make_service, receiver, tiny_model
):
    service = make_service(webhook_allowed_hosts=["127.0.0.1"])
    assert service.client.put("/v1/webhooks", json={"default_url": receiver.url}).is_success
    answer = service.client.post("/ui/submit", **multipart(tiny_model), follow_redirects=False)
    assert answer.status_code == 303, answer.text
    job_id = answer.headers["location"].removeprefix("/ui/jobs/")
    links = _delivered(service, receiver, job_id)["links"]
    assert links["self"] == f"{TEST_CLIENT_BASE}/v1/jobs/{job_id}"


@pytest.mark.parametrize(
    "value, problem",
    [
        ("autofusion.example.com", "absolute http"),
        ("ftp://autofusion.example.com", "absolute http"),
        ("https://autofusion.example.com/?a=1", "no query"),
        ("https://autofusion.example.com/#top", "no fragment"),
    ],
    ids=["no-scheme", "not-http", "query", "fragment"],
)
def test_public_url_is_checked_where_it_is_read(monkeypatch, value, problem):
    monkeypatch.setenv("AUTOFUSION_PUBLIC_URL", value)
    with pytest.raises(ValueError, match=problem):
        Settings()


def test_public_url_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("AUTOFUSION_PUBLIC_URL", " https://af.example.com:8443/ ")
    assert Settings().public_url == "https://af.example.com:8443"
    monkeypatch.setenv("AUTOFUSION_PUBLIC_URL", "")
    assert Settings().public_url is None


_SEGMENT = st.text("abcdefghijklmnopqrstuvwxyz0123456789-_", min_size=1, max_size=8)


@given(
    host=st.sampled_from(["af.example.com", "10.0.0.7:8000", "[::1]:8080"]),
    prefix=st.lists(_SEGMENT, max_size=3),
    slash=st.booleans(),
    names=st.lists(_SEGMENT, max_size=3, unique=True),
)
def test_every_link_is_the_base_followed_by_its_path(host, prefix, slash, names):
    base = f"https://{host}" + "".join(f"/{p}" for p in prefix) + ("/" if slash else "")
    job = "/v1/jobs/0b7c"
    links = {
        "self": job,
        "events": f"{job}/events",
        "model": None,
        "artifacts": {name: f"{job}/artifacts/{name}" for name in names},
    }
    made = absolute_links(links, base)
    assert made["model"] is None
    assert set(made["artifacts"]) == set(names)
    for path, link in zip(_leaves(links), _leaves(made), strict=True):
        assert link == base.rstrip("/") + path
        parts = urlsplit(link)
        assert parts.scheme == "https" and parts.netloc == host
