"""API keys, scopes and tenants on the job routes (``require_api_keys=True``)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from autofusion.app.core.models import ApiKey, utcnow
from autofusion.app.services.auth import create_key


@dataclass
class Keys:
    alice: str  # tenant A, jobs:write
    bob: str  # tenant B, jobs:write
    patterns_only: str  # tenant A, patterns:write


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


@pytest.fixture
def secured(make_service):
    service = make_service(require_api_keys=True)
    with service.db() as session:
        keys = Keys(
            alice=create_key(session, "tenant-a", ["jobs:write"], name="alice"),
            bob=create_key(session, "tenant-b", ["jobs:write"], name="bob"),
            patterns_only=create_key(session, "tenant-a", ["patterns:write"], name="ci"),
        )
    return service, keys


def test_no_key_is_401(secured, problem, tiny_model):
    service, _ = secured
    body = problem(service.client.get("/v1/jobs"), 401, "unauthorized")
    assert "Bearer" in body["detail"]
    problem(service.submit(tiny_model), 401, "unauthorized")
    assert service.job_count() == 0


def test_a_wrong_or_revoked_key_is_401(secured, problem):
    service, keys = secured
    problem(service.client.get("/v1/jobs", headers=bearer("af_wrong")), 401, "unauthorized")
    problem(service.client.get("/v1/jobs", headers={"X-API-Key": "nope"}), 401, "unauthorized")
    with service.db() as session:
        for key in session.query(ApiKey).filter_by(name="alice"):
            key.revoked_at = utcnow()
    problem(service.client.get("/v1/jobs", headers=bearer(keys.alice)), 401, "unauthorized")


def test_a_key_without_jobs_write_cannot_submit_or_cancel(secured, problem, tiny_model):
    service, keys = secured
    body = problem(service.submit(tiny_model, headers=bearer(keys.patterns_only)), 403, "forbidden")
    assert "jobs:write" in body["detail"]
    assert service.job_count() == 0 and service.uploads_left() == []

    job_id = service.submit(tiny_model, headers=bearer(keys.alice)).json()["id"]
    cancel = service.client.post(f"/v1/jobs/{job_id}/cancel", headers=bearer(keys.patterns_only))
    problem(cancel, 403, "forbidden")
    # Reading needs only a valid key of the same tenant.
    read = service.client.get(f"/v1/jobs/{job_id}", headers=bearer(keys.patterns_only))
    assert read.status_code == 200


def test_keys_work_in_either_header(secured, tiny_model):
    service, keys = secured
    assert service.submit(tiny_model, headers={"X-API-Key": keys.alice}).status_code == 202
    assert service.submit(tiny_model, headers=bearer(keys.alice)).status_code == 202


def test_another_tenants_job_is_not_found_anywhere(secured, problem, tiny_model):
    service, keys = secured
    job_id = service.submit(tiny_model, headers=bearer(keys.alice)).json()["id"]
    missing = "00000000-0000-0000-0000-000000000000"

    for method, suffix in [
        ("GET", ""),
        ("GET", "/model"),
        ("GET", "/report"),
        ("GET", "/events"),
        ("POST", "/cancel"),
    ]:
        theirs = service.client.request(
            method, f"/v1/jobs/{job_id}{suffix}", headers=bearer(keys.bob)
        )
        absent = service.client.request(
            method, f"/v1/jobs/{missing}{suffix}", headers=bearer(keys.bob)
        )
        body = problem(theirs, 404, "job-not-found")
        # Indistinguishable from a job that does not exist.
        assert body == {**problem(absent, 404, "job-not-found"), "detail": body["detail"]}

    assert service.client.get("/v1/jobs", headers=bearer(keys.bob)).json()["total"] == 0
    mine = service.client.get("/v1/jobs", headers=bearer(keys.alice)).json()
    assert [j["id"] for j in mine["items"]] == [job_id]
    still = service.client.get(f"/v1/jobs/{job_id}", headers=bearer(keys.alice)).json()
    assert still["status"] == "queued"


def test_idempotency_keys_belong_to_a_tenant(secured, tiny_model):
    service, keys = secured
    a = service.submit(
        tiny_model, headers={**bearer(keys.alice), "Idempotency-Key": "k"}, config={}
    )
    b = service.submit(
        tiny_model, headers={**bearer(keys.bob), "Idempotency-Key": "k"}, config={"max_rounds": 2}
    )
    assert a.status_code == b.status_code == 202
    assert a.json()["id"] != b.json()["id"]
    assert service.enqueued == [a.json()["id"], b.json()["id"]]


def test_probes_need_no_key(secured):
    service, _ = secured
    assert service.client.get("/healthz").status_code == 200
    assert service.client.get("/readyz").status_code == 200
    # /metrics is not a probe: it needs a metrics:read key (tests/app/test_headers.py).
    assert service.client.get("/metrics").status_code == 401


def test_without_required_keys_everything_belongs_to_the_default_tenant(service, tiny_model):
    job = service.submit(tiny_model).json()
    assert service.client.get(f"/v1/jobs/{job['id']}").status_code == 200
    with service.db() as session:
        token = create_key(session, "someone-else", ["jobs:write"])
    # A key still identifies its tenant when keys are optional.
    other = service.client.get(f"/v1/jobs/{job['id']}", headers=bearer(token))
    assert other.status_code == 404
