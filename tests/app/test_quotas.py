"""Per-tenant quotas at submit (issue 26): queued jobs (429 too-many-queued-jobs) and
stored bytes (507 storage-quota-exceeded), each with Retry-After where it applies, per
tenant, on SQLite and PostgreSQL; and DELETE /v1/jobs/{id}, which frees them."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import select

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import Job, JobArtifact, JobStatus
from autofusion.app.services.auth import SCOPES, Principal, create_key, ensure_tenant
from autofusion.app.services.jobs import create_job
from autofusion.app.services.quotas import MULTIPART_SLACK_BYTES, Quotas, stored_bytes
from tests.app.conftest import relu_model


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request) -> dict:
    if request.param == "postgresql":
        return {"database_url": request.getfixturevalue("postgres_url")}
    return {}


def _keys(service) -> tuple[dict[str, str], dict[str, str]]:
    with service.db() as session:
        alice = create_key(session, "tenant-a", ["jobs:write"], name="alice")
        bob = create_key(session, "tenant-b", ["jobs:write"], name="bob")
    return {"Authorization": f"Bearer {alice}"}, {"Authorization": f"Bearer {bob}"}


def _model(width: int) -> bytes:
    """A distinct small model per width (each its own blob in the store)."""
    return relu_model(width).SerializeToString()


def test_the_queued_limit_answers_429_with_retry_after_per_tenant(make_service, database, problem):
    service = make_service(require_api_keys=True, max_queued_jobs_per_tenant=2, **database)
    alice, bob = _keys(service)
    first = [service.submit(_model(w), headers=alice) for w in (3, 4)]
    assert [r.status_code for r in first] == [202, 202]

    refused = service.submit(_model(5), headers=alice)
    body = problem(refused, 429, "too-many-queued-jobs")
    assert int(refused.headers["Retry-After"]) > 0
    assert body["queued_jobs"] == 2 and body["limit"] == 2
    assert "max_queued_jobs_per_tenant" in body["detail"] and "cancel" in body["detail"]
    assert service.job_count() == 2  # nothing was kept of the refused one

    assert service.submit(_model(5), headers=bob).status_code == 202  # B is not A
    # A job that starts leaves the queue: A may submit again.
    service.update_job(first[0].json()["id"], status=JobStatus.running.value)
    assert service.submit(_model(6), headers=alice).status_code == 202


def test_a_retry_of_a_request_whose_job_exists_is_answered_with_it_at_the_limit(make_service):
    service = make_service(max_queued_jobs_per_tenant=1)
    key = {"Idempotency-Key": "build-1"}
    created = service.submit(_model(3), headers=key)
    replay = service.submit(_model(3), headers=key)
    assert replay.status_code == 202 and replay.headers["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == created.json()["id"]


def test_the_stored_bytes_limit_answers_507_and_says_what_frees_room(
    make_service, database, problem
):
    model = _model(3)
    service = make_service(max_stored_bytes_per_tenant=len(model) + 10, **database)
    accepted = service.submit(model)
    assert accepted.status_code == 202
    with service.db() as session:
        assert stored_bytes(session, "default") == len(model)

    refused = service.submit(_model(4))
    body = problem(refused, 507, "storage-quota-exceeded")
    assert body["stored_bytes"] == len(model) and body["limit_bytes"] == len(model) + 10
    for words in ("max_stored_bytes_per_tenant", "DELETE /v1/jobs/{id}", "retention"):
        assert words in body["detail"], body["detail"]
    assert "Retry-After" not in refused.headers  # nothing has ended: retention frees nothing

    # Once a job has ended, retention will free room: Retry-After says when.
    service.update_job(
        accepted.json()["id"],
        status=JobStatus.succeeded.value,
        finished_at=datetime.now(UTC) - timedelta(days=29),
    )
    refused = service.submit(_model(4))
    problem(refused, 507, "storage-quota-exceeded")
    wait = int(refused.headers["Retry-After"])
    assert 86400 - 60 < wait <= 86400 + service.settings.scratch_sweep_interval_s + 1


def test_the_stored_bytes_limit_refuses_before_the_body_is_stored(make_service, problem):
    """Content-Length alone is enough: the body is not received, nothing is stored."""
    service = make_service(max_stored_bytes_per_tenant=100)
    body = b"\0" * (MULTIPART_SLACK_BYTES + 1000)  # never read: its length refuses it
    problem(service.submit(body), 507, "storage-quota-exceeded")
    blobs = service.settings.artifacts_dir
    assert not [p for p in blobs.rglob("*") if p.is_file()]
    assert service.uploads_left() == []


def test_the_stored_bytes_are_per_tenant_and_a_shared_blob_counts_once(make_service, problem):
    model = _model(3)
    service = make_service(require_api_keys=True, max_stored_bytes_per_tenant=len(model) + 10)
    alice, bob = _keys(service)
    assert service.submit(model, headers=alice).status_code == 202
    # The same model again is the same blob: it stores nothing more.
    assert service.submit(model, headers=alice).status_code == 202
    problem(service.submit(_model(4), headers=alice), 507, "storage-quota-exceeded")
    assert service.submit(_model(4), headers=bob).status_code == 202


def test_the_limits_hold_when_submits_race(make_service, database):
    """The check made with the insert, behind the tenant's lock: of eight submits at once
    with two places left, two get a job."""
    service = make_service(**database)
    quotas = Quotas(max_queued_jobs=2)
    principal = Principal("racer", frozenset(SCOPES))
    with service.db() as session:
        ensure_tenant(session, "racer")
        digest = service.app.state.store.put_bytes(_model(3))
    outcomes: list[str] = []
    start = threading.Barrier(8)

    def submit(n: int) -> None:
        start.wait()
        try:
            with service.db() as session:
                create_job(
                    session,
                    principal,
                    model_name="m.onnx",
                    model_digest=digest,
                    data_files=[],
                    config={"n": n},
                    strategy=None,
                    idempotency_key=None,
                    max_attempts=3,
                    quotas=quotas,
                )
            outcomes.append("created")
        except ProblemError as exc:
            outcomes.append(exc.slug)

    threads = [threading.Thread(target=submit, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(outcomes) == ["created"] * 2 + ["too-many-queued-jobs"] * 6
    with service.db() as session:
        assert len(session.scalars(select(Job).where(Job.tenant_id == "racer")).all()) == 2


def test_zero_turns_a_limit_off(make_service):
    service = make_service(max_queued_jobs_per_tenant=0, max_stored_bytes_per_tenant=0)
    assert all(service.submit(_model(w)).status_code == 202 for w in (3, 4, 5))


# ----- DELETE /v1/jobs/{id} ---------------------------------------------------------------


def test_delete_removes_an_ended_job_and_frees_the_quota(make_service, database, problem):
    model = _model(3)
    service = make_service(max_stored_bytes_per_tenant=len(model) + 10, **database)
    job_id = service.submit(model).json()["id"]
    service.succeed(job_id, b"fused", {"report": True})
    problem(service.submit(_model(4)), 507, "storage-quota-exceeded")

    deleted = service.client.delete(f"/v1/jobs/{job_id}")
    assert deleted.status_code == 204 and deleted.content == b""
    body = problem(service.client.get(f"/v1/jobs/{job_id}"), 404, "job-not-found")
    assert job_id in body["detail"]
    problem(service.client.delete(f"/v1/jobs/{job_id}"), 404, "job-not-found")
    assert service.client.get("/v1/jobs").json()["items"] == []
    with service.db() as session:
        assert session.scalars(select(JobArtifact)).all() == []
    assert service.submit(_model(4)).status_code == 202  # the room is back


def test_delete_refuses_a_running_job_and_takes_a_queued_one(make_service, problem):
    service = make_service()
    running = service.submit(_model(3)).json()["id"]
    service.update_job(running, status=JobStatus.running.value)
    body = problem(service.client.delete(f"/v1/jobs/{running}"), 409, "job-running")
    assert f"/v1/jobs/{running}/cancel" in body["detail"]
    assert service.client.get(f"/v1/jobs/{running}").json()["status"] == "running"

    queued = service.submit(_model(4)).json()["id"]
    assert service.client.delete(f"/v1/jobs/{queued}").status_code == 204
    assert service.job_count() == 1


def test_delete_is_the_tenants_own(make_service, problem):
    service = make_service(require_api_keys=True)
    alice, bob = _keys(service)
    job_id = service.submit(_model(3), headers=alice).json()["id"]
    problem(service.client.delete(f"/v1/jobs/{job_id}", headers=bob), 404, "job-not-found")
    assert service.job_count() == 1


def test_the_dashboard_deletes_a_finished_job(make_service):
    service = make_service()
    job_id = service.submit(_model(3)).json()["id"]
    service.succeed(job_id, b"fused", {"report": True})
    page = service.client.get(f"/ui/jobs/{job_id}")
    assert 'id="delete-form"' in page.text
    answer = service.client.post(f"/ui/jobs/{job_id}/delete", follow_redirects=False)
    assert answer.status_code == 303 and answer.headers["location"] == "/ui/jobs"
    assert job_id not in service.client.get("/ui/jobs").text
    assert service.client.get(f"/ui/jobs/{job_id}").status_code == 404
