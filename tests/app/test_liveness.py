"""Liveness that is true (issue 27): ``/readyz`` is not ready while no worker can take a
job, workers' heartbeats say which are alive, the embedded worker restarts itself after
its thread died, the dashboard shows a banner while no worker is alive, and a queued job
says why it waits."""

from __future__ import annotations

import json
import shutil
import time
from datetime import timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from autofusion.app.cli.serve import service_app
from autofusion.app.core.config import Settings
from autofusion.app.core.models import JobStatus, WorkerHeartbeat, utcnow
from autofusion.app.services.worker_health import WorkerIdentity, record_heartbeat
from autofusion.worker.embedded import RestartBackoff
from autofusion.worker.heartbeat import Heartbeat
from tests.app.cli_server import start_cli, stop_process
from tests.app.conftest import relu_model

WORKER = WorkerIdentity(mode="distributed", slots=1, host="worker-1", pid=4242)


def _beat(service, identity: WorkerIdentity = WORKER, *, age_s: float = 0.0) -> None:
    """A heartbeat of ``identity``, ``age_s`` seconds old."""
    with service.db() as session:
        record_heartbeat(session, identity, 0, stale_after_s=service.settings.worker_stale_after_s)
    if age_s:
        with service.db() as session:
            row = session.get(WorkerHeartbeat, identity.name)
            row.last_seen = utcnow() - timedelta(seconds=age_s)


def _worker_check(service) -> tuple[int, str]:
    response = service.client.get("/readyz")
    return response.status_code, response.json()["checks"]["worker"]


def test_readyz_waits_for_a_worker_and_stops_when_it_goes_stale(make_service, problem):
    service = make_service(readyz_requires_worker=True)
    body = problem(service.client.get("/readyz"), 503, "not-ready")
    assert body["checks"]["database"] == "ok" and body["checks"]["broker"] == "ok"
    assert "no worker has reported in yet" in body["checks"]["worker"]
    assert "autofusion worker" in body["detail"]  # says what to do

    _beat(service)
    ready = service.client.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"]["worker"] == "ok"

    _beat(service, age_s=service.settings.worker_stale_after_s + 30)
    status, reason = _worker_check(service)
    assert status == 503
    assert reason.startswith(
        f"no worker has reported in {service.settings.worker_stale_after_s + 30:.0f} s"
    )


def test_readyz_leaves_workers_out_when_not_required(make_service):
    service = make_service(readyz_requires_worker=False)
    ready = service.client.get("/readyz")
    assert ready.status_code == 200 and "worker" not in ready.json()["checks"]


def test_the_embedded_worker_answers_for_itself_before_its_heartbeat_goes_stale(make_service):
    service = make_service(readyz_requires_worker=True)
    _beat(service)  # fresh: the thread died a moment ago

    class DeadThread:
        def problem(self) -> str | None:
            return "the in-process worker is not running"

    service.app.state.local_worker = DeadThread()
    assert _worker_check(service) == (503, "the in-process worker is not running")


def test_a_heartbeat_is_written_only_while_the_worker_is_alive(make_service):
    service = make_service()
    alive = [True]
    settings = service.settings
    heartbeat = Heartbeat(settings, WORKER, alive=lambda: alive[0], running=lambda: 1)
    assert heartbeat.beat_once()
    with service.db() as session:
        row = session.get(WorkerHeartbeat, WORKER.name)
        assert (row.mode, row.running, row.slots, row.pid) == ("distributed", 1, 1, 4242)
        first = row.last_seen
    alive[0] = False
    assert not heartbeat.beat_once()
    with service.db() as session:
        assert session.get(WorkerHeartbeat, WORKER.name).last_seen == first
    heartbeat.stop()  # a clean stop says so at once
    with service.db() as session:
        assert session.get(WorkerHeartbeat, WORKER.name) is None


def test_rows_of_workers_gone_for_long_are_removed(make_service):
    service = make_service()
    gone = WorkerIdentity(mode="distributed", slots=1, host="gone", pid=1)
    _beat(service, gone, age_s=service.settings.worker_stale_after_s * 100)
    _beat(service)
    with service.db() as session:
        assert session.get(WorkerHeartbeat, gone.name) is None
        assert session.get(WorkerHeartbeat, WORKER.name) is not None


def test_stale_after_must_exceed_the_heartbeat_interval(tmp_path):
    with pytest.raises(ValidationError, match="worker_stale_after_s"):
        Settings(data_dir=tmp_path, worker_heartbeat_interval_s=10, worker_stale_after_s=10)


def test_restart_backoff_doubles_up_to_its_cap_and_starts_over_after_a_healthy_run():
    backoff = RestartBackoff(1.0, 8.0)
    assert [backoff.next_delay(0.1) for _ in range(6)] == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert backoff.next_delay(8.0) == 1.0  # it ran for the cap: a new failure
    assert backoff.next_delay(0.1) == 2.0


def test_a_queued_job_says_why_it_waits(make_service, tiny_model):
    service = make_service(max_running_jobs_per_tenant=1)
    first = service.submit(tiny_model).json()["id"]

    def waiting(job_id: str) -> str | None:
        return service.client.get(f"/v1/jobs/{job_id}").json()["waiting"]

    assert waiting(first).startswith("no worker is alive")
    _beat(service)
    assert waiting(first) == "waiting for a free worker (next in line)"
    second = service.submit(tiny_model).json()["id"]
    assert waiting(second) == "waiting for a free worker (1 job ahead)"

    service.update_job(
        first, status=JobStatus.running.value, lease_until=utcnow() + timedelta(minutes=5)
    )
    assert waiting(first) is None  # running: nothing to wait for
    assert waiting(second) == "held: tenant at its running limit (1)"


def test_a_poll_is_not_told_304_when_only_the_reason_changed(make_service, tiny_model):
    service = make_service()
    job_id = service.submit(tiny_model).json()["id"]
    first = service.client.get(f"/v1/jobs/{job_id}")
    etag = first.headers["etag"]
    again = service.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": etag})
    assert again.status_code == 304
    _beat(service)  # a worker came: same revision, another reason
    changed = service.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["etag"] != etag
    assert changed.json()["revision"] == first.json()["revision"]


def test_the_dashboard_shows_a_banner_while_no_worker_is_alive(make_service, tiny_model):
    service = make_service()
    job_id = service.submit(tiny_model).json()["id"]
    page = service.client.get("/ui/jobs")
    assert 'id="worker-banner"' in page.text and "autofusion worker" in page.text
    job_page = service.client.get(f"/ui/jobs/{job_id}").text
    assert 'id="job-waits-for"' in job_page and "no worker is alive" in job_page

    _beat(service)
    assert 'id="worker-banner"' not in service.client.get("/ui/jobs").text
    live = service.client.get(f"/ui/jobs/{job_id}/live").text  # the polled fragment
    assert "waiting for a free worker (next in line)" in live


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    pytest.fail(f"{what} not within {timeout:g} s")


@pytest.mark.slow
def test_the_embedded_worker_restarts_after_its_broker_folder_came_back(tmp_path: Path):
    """As in the issue: the broker's folder goes missing, the worker thread dies; once the
    folder is back, the worker restarts by itself and a new job runs, with no restart of
    the process."""
    settings = Settings(
        data_dir=tmp_path / "data",
        embedded_worker_restart_min_s=0.2,
        embedded_worker_restart_max_s=0.8,
        worker_heartbeat_interval_s=0.2,
        worker_stale_after_s=2.0,
    )
    with TestClient(service_app(settings)) as client:
        assert client.get("/readyz").status_code == 200
        worker = client.app.state.local_worker
        aside = tmp_path / "broker-aside"
        shutil.move(settings.broker_dir, aside)
        _wait(lambda: worker.restarts >= 2, 20, "two restarts")
        down = client.get("/readyz").json()["checks"]["worker"]
        assert "stopped after an error" in down
        assert 'id="worker-banner"' in client.get("/ui/jobs").text

        shutil.move(aside, settings.broker_dir)
        _wait(lambda: client.get("/readyz").status_code == 200, 20, "ready again")
        files = [("model", ("relu.onnx", relu_model().SerializeToString()))]
        config = json.dumps({"target": "generic", "profile": False})
        location = client.post("/v1/optimize", files=files, data={"config": config})
        assert location.status_code == 202, location.text
        url = location.headers["location"]
        job = _wait(
            lambda: (j := client.get(url).json())["status"] in ("succeeded", "failed") and j,
            90,
            "the job's end",
        )
        assert job["status"] == "succeeded", job


@pytest.mark.slow
def test_an_api_without_a_worker_is_ready_once_an_autofusion_worker_runs(make_service, tmp_path):
    """API-only (as compose's api service): not ready until a separate `autofusion worker`
    beats; its clean stop removes its row, and the API is not ready again at once."""
    service = make_service(readyz_requires_worker=True)
    assert service.client.get("/readyz").status_code == 503
    env = {
        "AUTOFUSION_DATA_DIR": str(service.settings.data_dir),
        "AUTOFUSION_WORKER_HEARTBEAT_INTERVAL_S": "0.5",
        "AUTOFUSION_WORKER_STALE_AFTER_S": "5",
    }
    worker = start_cli(["worker", "--pool", "solo"], tmp_path / "worker.log", env)
    try:
        _wait(
            lambda: service.client.get("/readyz").status_code == 200 or worker.poll() is not None,
            60,
            "a heartbeat",
        )
        assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
        with service.db() as session:
            row = session.query(WorkerHeartbeat).one()
            assert (row.mode, row.slots) == ("distributed", 1)
    finally:
        stop_process(worker)
    assert _worker_check(service)[0] == 503
