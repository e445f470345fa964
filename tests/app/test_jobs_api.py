"""The job API: submit (202, Location, Retry-After, idempotency, config validation), read
(ETag and 304), list (filter, pagination), cancel, follow (server-sent events), download
(model, report), plus health, readiness and metrics."""

from __future__ import annotations

import json
import shutil
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from autofusion.app.core.errors import JOB_PROBLEMS
from autofusion.app.core.models import Job, JobStatus, PatternRecord, Strategy
from autofusion.app.services.jobs import claim_job, finish_job, report_progress

REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "tests" / "data" / "resnet" / "resnet50_w8_torchscript.onnx"


def _parse_time(text: str) -> datetime:
    value = datetime.fromisoformat(text)
    assert value.tzinfo is not None and value.utcoffset().total_seconds() == 0, text
    return value


def test_optimize_answers_202_with_location_retry_after_and_the_job(service, tiny_model):
    response = service.submit(tiny_model, model_name="relu.onnx", config={"target": "onnxruntime"})

    assert response.status_code == 202, response.text
    job = response.json()
    assert response.headers["location"] == f"/v1/jobs/{job['id']}"
    assert response.headers["retry-after"] == str(service.settings.retry_after_s)
    assert response.headers["etag"] == f'"{job["revision"]}"'
    assert job["status"] == "queued" and job["stage"] == "queued" and job["progress"] == 0
    assert job["model_name"] == "relu.onnx"
    assert job["config"] == {"target": "onnxruntime"} and job["strategy"] is None
    assert job["attempts"] == 0 and job["data_files"] == []
    assert job["started_at"] is None and job["finished_at"] is None
    assert _parse_time(job["created_at"]) <= _parse_time(job["updated_at"])
    assert abs((datetime.now(UTC) - _parse_time(job["created_at"])).total_seconds()) < 60
    assert job["links"]["model"] is None and job["links"]["report"] is None
    # Enqueued once, after the commit: the row is already there for the worker.
    assert service.enqueued == [job["id"]]
    assert service.app.state.store.read_bytes(job["model_digest"]) == tiny_model
    assert service.uploads_left() == []


def test_the_job_is_committed_before_it_is_enqueued(service, tiny_model):
    seen = []

    def enqueue(job_id: str) -> None:
        with service.db() as session:  # another connection: sees committed rows only
            seen.append(session.get(Job, job_id).status)

    service.app.state.enqueue = enqueue
    assert service.submit(tiny_model).status_code == 202
    assert seen == ["queued"]


def test_a_broken_queue_does_not_lose_the_job(service, tiny_model):
    def enqueue(job_id: str) -> None:
        raise ConnectionError("broker down")

    service.app.state.enqueue = enqueue
    response = service.submit(tiny_model)
    # The row is the source of truth: the reaper sends queued jobs again.
    assert response.status_code == 202 and service.job_count() == 1


def test_config_may_be_sent_as_a_file_part(service, tiny_model):
    files = [
        ("model", ("m.onnx", tiny_model)),
        ("config", ("config.json", b'{"target": "onnxruntime"}', "application/json")),
    ]
    response = service.client.post("/v1/optimize", files=files)
    assert response.status_code == 202, response.text
    assert response.json()["config"] == {"target": "onnxruntime"}


def test_optimize_accepts_the_committed_resnet(service):
    response = service.submit(RESNET.read_bytes(), model_name=RESNET.name)
    assert response.status_code == 202, response.text
    assert response.json()["model_name"] == RESNET.name


def test_get_job_has_an_etag_and_answers_304_until_it_changes(service, tiny_model):
    job_id = service.submit(tiny_model).json()["id"]

    first = service.client.get(f"/v1/jobs/{job_id}")
    assert first.status_code == 200 and first.json()["id"] == job_id
    etag = first.headers["etag"]
    assert first.headers["retry-after"]  # still queued: poll again later

    unchanged = service.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": etag})
    assert unchanged.status_code == 304 and unchanged.content == b""
    assert unchanged.headers["etag"] == etag
    listed = service.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": f'"x", W/{etag}'})
    assert listed.status_code == 304

    assert service.client.post(f"/v1/jobs/{job_id}/cancel").status_code == 202
    changed = service.client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": etag})
    assert changed.status_code == 200
    assert changed.headers["etag"] != etag
    assert changed.json()["status"] == "cancelled"
    assert "retry-after" not in changed.headers  # final: nothing more to wait for


def test_list_filters_by_status_and_paginates_newest_first(service, tiny_model):
    ids = [service.submit(tiny_model, config={"max_rounds": n}).json()["id"] for n in (1, 2, 3)]
    service.client.post(f"/v1/jobs/{ids[0]}/cancel")

    everything = service.client.get("/v1/jobs").json()
    assert everything["total"] == 3
    assert [j["id"] for j in everything["items"]] == ids[::-1]

    queued = service.client.get("/v1/jobs", params={"status": "queued"}).json()
    assert queued["total"] == 2 and {j["id"] for j in queued["items"]} == set(ids[1:])
    cancelled = service.client.get("/v1/jobs", params={"status": "cancelled"}).json()
    assert [j["id"] for j in cancelled["items"]] == [ids[0]]

    first = service.client.get("/v1/jobs", params={"page_size": 2}).json()
    assert first["total"] == 3 and first["page_size"] == 2
    assert [j["id"] for j in first["items"]] == ids[:0:-1] and first["next_page_token"]
    last = service.client.get("/v1/jobs", params={"page_token": first["next_page_token"]}).json()
    assert [j["id"] for j in last["items"]] == [ids[0]] and last["next_page_token"] is None
    # Deprecated, still answered: limit is page_size, offset skips rows.
    page = service.client.get("/v1/jobs", params={"limit": 1, "offset": 1}).json()
    assert page["total"] == 3 and page["page_size"] == 1
    assert [j["id"] for j in page["items"]] == [ids[1]]
    assert service.client.get("/v1/jobs", params={"offset": 5}).json()["items"] == []


@pytest.mark.parametrize(
    "params",
    [{"status": "done"}, {"offset": -1}, {"page_size": -1}, {"offset": "1" * 30}],
)
def test_list_rejects_bad_parameters(service, problem, params):
    problem(service.client.get("/v1/jobs", params=params), 422, "invalid-request")


@pytest.mark.parametrize(
    ("params", "size"), [({}, 50), ({"page_size": 0}, 50), ({"page_size": 10_000}, 200)]
)
def test_the_page_size_defaults_and_is_clamped(service, params, size):
    # AIP-158: 0 or absent is the default; more than the maximum is the maximum, not 422.
    assert service.client.get("/v1/jobs", params=params).json()["page_size"] == size
    assert (
        service.client.get("/v1/jobs", params={"limit": params.get("page_size", 0)}).json()[
            "page_size"
        ]
        == size
    )


def test_cancel_a_queued_job_then_again_is_a_conflict(service, tiny_model, problem):
    job_id = service.submit(tiny_model).json()["id"]

    cancelled = service.client.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status_code == 202
    assert cancelled.json()["status"] == "cancelled" and cancelled.json()["finished_at"]

    body = problem(service.client.post(f"/v1/jobs/{job_id}/cancel"), 409, "job-finished")
    assert "cancelled" in body["detail"]


def test_cancel_a_running_job_asks_the_worker_to_stop(service, tiny_model):
    job_id = service.submit(tiny_model).json()["id"]
    with service.db() as session:
        assert claim_job(session, job_id, "worker-1", lease_s=60) is not None

    response = service.client.post(f"/v1/jobs/{job_id}/cancel")
    assert response.status_code == 202
    assert response.json()["status"] == "running" and response.json()["cancel_requested"]


def test_results_of_a_job_that_has_not_succeeded_are_a_conflict(service, tiny_model, problem):
    job_id = service.submit(tiny_model).json()["id"]
    for what in ("model", "report"):
        body = problem(service.client.get(f"/v1/jobs/{job_id}/{what}"), 409, "job-not-succeeded")
        assert body["job_status"] == "queued"


def test_unknown_job_is_a_404_problem_everywhere(service, problem):
    missing = "00000000-0000-0000-0000-000000000000"
    for method, path in [
        ("GET", ""),
        ("POST", "/cancel"),
        ("GET", "/events"),
        ("GET", "/model"),
        ("GET", "/report"),
    ]:
        response = service.client.request(method, f"/v1/jobs/{missing}{path}")
        problem(response, 404, "job-not-found")


def test_same_idempotency_key_and_payload_returns_the_same_job(service, tiny_model, problem):
    headers = {"Idempotency-Key": "build-1234"}
    first = service.submit(tiny_model, config={"target": "generic"}, headers=headers)
    again = service.submit(tiny_model, config={"target": "generic"}, headers=headers)

    assert first.status_code == again.status_code == 202
    assert again.json()["id"] == first.json()["id"]
    assert again.headers["location"] == first.headers["location"]
    assert again.headers["idempotent-replayed"] == "true"
    assert service.enqueued == [first.json()["id"]]

    other = service.submit(tiny_model, config={"target": "onnxruntime"}, headers=headers)
    body = problem(other, 422, "idempotency-key-reused")
    assert first.json()["id"] in body["detail"]

    fresh = service.submit(
        tiny_model, config={"target": "generic"}, headers={"Idempotency-Key": "b"}
    )
    assert fresh.status_code == 202 and fresh.json()["id"] != first.json()["id"]
    assert service.job_count() == 2 and len(service.enqueued) == 2


@pytest.mark.parametrize(
    ("config", "field"),
    [
        pytest.param({"target": "tpu"}, "config.target", id="bad-target"),
        pytest.param({"check": {"rtol": -1}}, "config.check.rtol", id="nested"),
        pytest.param({"max_rounds": 0}, "config.max_rounds", id="range"),
        pytest.param({"bogus": 1}, "config.bogus", id="unknown-field"),
        pytest.param({"strategy": ""}, "config.strategy", id="empty-strategy"),
        pytest.param({"strategy": "nope"}, "config.strategy", id="unknown-strategy"),
        pytest.param("{not json", "config", id="not-json"),
        pytest.param("[1, 2]", "config", id="not-an-object"),
    ],
)
def test_invalid_config_is_a_422_naming_the_field(service, tiny_model, problem, config, field):
    body = problem(service.submit(tiny_model, config=config), 422, "invalid-config")
    assert field in [e["field"] for e in body["errors"]], body
    assert field in body["detail"]
    assert service.job_count() == 0 and service.enqueued == []
    assert service.uploads_left() == []


def test_a_named_strategy_is_recorded_apart_from_the_config(service, tiny_model):
    with service.db() as session:
        session.add(Strategy(name="acme.edge", version=1, data={"name": "acme.edge"}))
    config = {"strategy": "acme.edge", "check": {"samples": 3}}

    job = service.submit(tiny_model, config=config).json()

    assert job["strategy"] == "acme.edge"
    assert job["config"] == {"check": {"samples": 3}}


def test_names_the_worker_would_fail_on_are_a_422_at_submit(service, tiny_model, problem):
    """Known at submit time, refused then (before: 202, then a job failed with a string)."""
    with service.db() as session:
        session.get(PatternRecord, "conv_bn_relu").enabled = False
    config = {"patterns": ["conv_bn", "acme.nope"], "exclude": ["conv_bn_relu"]}
    body = problem(service.submit(tiny_model, config=config), 422, "invalid-config")
    assert body["errors"] == [
        {"field": "config.patterns.1", "message": Containing("no pattern 'acme.nope'")},
        {"field": "config.exclude.0", "message": Containing("'conv_bn_relu' is disabled")},
    ]
    strategy = service.submit(tiny_model, config={"strategy": "acme.gone"})
    assert "no strategy named 'acme.gone'" in problem(strategy, 422, "invalid-config")["detail"]
    assert service.job_count() == 0 and service.enqueued == []
    # A pattern the job brings itself may be named.
    extra = {"name": "acme.mine", "nodes": [{"id": "r", "op": "Relu"}]}
    extra["rewriter"] = {"name": "fused_region", "params": {"domain": "ai.acme"}}
    mine = {"extra_patterns": [extra], "patterns": ["acme.mine"]}
    assert service.submit(tiny_model, config=mine).status_code == 202


class Containing(str):
    """Equal to any string that contains this one."""

    def __eq__(self, other: object) -> bool:
        return isinstance(other, str) and str(self) in other

    __hash__ = str.__hash__


@pytest.mark.parametrize(
    ("slug", "status"),
    [("check-failed", "failed"), (None, "failed"), ("crashed", "queued")],
)
def test_a_jobs_error_is_a_problem_object_of_a_documented_type(service, tiny_model, slug, status):
    job_id = service.submit(tiny_model).json()["id"]
    assert service.client.get(f"/v1/jobs/{job_id}").json()["error"] is None
    detail = "what happened, and what to do"
    service.update_job(job_id, status=status, error=detail, error_type=slug)
    job = service.client.get(f"/v1/jobs/{job_id}").json()
    kind = slug or "job-failed"  # rows from before the worker typed its errors
    assert job["error"] == {
        "type": f"https://autofusion.dev/problems/{kind}",
        "title": JOB_PROBLEMS[kind],
        "detail": detail,
    }
    assert job["error_type"] == job["error"]["type"]  # deprecated mirror
    page = service.client.get(f"/ui/jobs/{job_id}").text
    assert 'id="job-error"' in page and detail in page
    if slug and status == "failed":  # the dashboard names the type of a failed job
        assert JOB_PROBLEMS[slug] in page and f'data-type="{slug}"' in page


def _read_events(lines) -> list[tuple[str, dict, str | None]]:
    events, name, data, event_id = [], None, None, None
    for line in lines:
        if line.startswith("event: "):
            name = line.removeprefix("event: ")
        elif line.startswith("id: "):
            event_id = line.removeprefix("id: ")
        elif line.startswith("data: "):
            data = json.loads(line.removeprefix("data: "))
        elif line == "" and name is not None:
            events.append((name, data, event_id))
            name, data, event_id = None, None, None
    return events


def _run_like_a_worker(service, job_id: str) -> None:
    """Claim, report progress and succeed, with pauses the event stream can see; each
    step its own transaction, as the worker commits them (the services only flush)."""
    steps = [
        lambda session: claim_job(session, job_id, "worker-1", lease_s=60),
        lambda session: report_progress(session, job_id, "worker-1", "match", 0.5, lease_s=60),
        lambda session: finish_job(
            session, job_id, "worker-1", status=JobStatus.succeeded, summary={"n": 1}
        ),
    ]
    for step in steps:
        time.sleep(0.2)
        with service.db() as session:
            step(session)


def test_events_stream_each_change_then_the_end_and_close(service, tiny_model):
    job_id = service.submit(tiny_model).json()["id"]
    worker = threading.Thread(target=_run_like_a_worker, args=(service, job_id))
    worker.start()
    try:
        with service.client.stream("GET", f"/v1/jobs/{job_id}/events") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = _read_events(response.iter_lines())
    finally:
        worker.join()

    names = [name for name, _, _ in events]
    assert names[-1] == "done" and set(names[:-1]) == {"progress"}
    progress = [data for name, data, _ in events if name == "progress"]
    revisions = [data["revision"] for data in progress]
    assert revisions == sorted(set(revisions))
    assert [e[2] for e in events[:-1]] == [str(r) for r in revisions]
    assert progress[0]["status"] == "queued"
    assert "running" in {data["status"] for data in progress}
    assert events[-1][1]["status"] == "succeeded" and events[-1][1]["progress"] == 1.0

    # Reconnecting with the last id seen sends only what is new: here, just the end.
    resumed = service.client.get(
        f"/v1/jobs/{job_id}/events", headers={"Last-Event-ID": str(revisions[-1])}
    )
    assert [name for name, _, _ in _read_events(resumed.text.splitlines())] == ["done"]


def test_downloads_after_success(service, tiny_model):
    job_id = service.submit(tiny_model, model_name="relu.onnx").json()["id"]
    fused, report = b"fused model bytes", {"fusions": [{"pattern": "x"}], "check": {"ok": True}}
    service.succeed(job_id, fused, report)

    job = service.client.get(f"/v1/jobs/{job_id}").json()
    assert job["status"] == "succeeded" and job["summary"] == {"fusions": 1}
    assert job["links"]["model"] == f"/v1/jobs/{job_id}/model"
    assert job["links"]["report"] == f"/v1/jobs/{job_id}/report"

    model = service.client.get(job["links"]["model"])
    assert model.status_code == 200 and model.content == fused
    assert model.headers["content-type"] == "application/octet-stream"
    assert 'filename="relu.fused.onnx"' in model.headers["content-disposition"]
    assert list((service.settings.data_dir / "downloads").iterdir()) == []

    got = service.client.get(job["links"]["report"])
    assert got.status_code == 200 and got.headers["content-type"] == "application/json"
    assert got.json() == report


def test_report_renderings_are_served_as_artifacts(service, tiny_model, problem):
    job_id = service.submit(tiny_model).json()["id"]
    problem(
        service.client.get(f"/v1/jobs/{job_id}/artifacts/report.html"), 409, "job-not-succeeded"
    )
    store = service.app.state.store
    html = "<!doctype html><title>report</title>"
    service.succeed(job_id, b"fused", {"fusions": {}})
    service.update_job(
        job_id,
        summary={"artifacts": {"report.html": store.put_bytes(html.encode())}},
    )
    job = service.client.get(f"/v1/jobs/{job_id}").json()
    assert job["links"]["artifacts"] == {"report.html": f"/v1/jobs/{job_id}/artifacts/report.html"}
    got = service.client.get(job["links"]["artifacts"]["report.html"])
    assert got.status_code == 200 and got.text == html
    assert got.headers["content-type"].startswith("text/html")
    assert "default-src 'none'" in got.headers["content-security-policy"]
    problem(service.client.get(f"/v1/jobs/{job_id}/artifacts/report.md"), 409, "job-not-succeeded")
    body = problem(
        service.client.get(f"/v1/jobs/{job_id}/artifacts/secrets.txt"), 404, "artifact-not-found"
    )
    assert "report.html" in body["detail"]


def test_healthz_and_readyz(service, problem, monkeypatch):
    assert service.client.get("/healthz").json() == {"status": "ok"}
    ready = service.client.get("/readyz")
    assert ready.status_code == 200
    checks = {"database": "ok", "broker": "ok", "artifacts": "ok"}
    assert ready.json() == {"status": "ready", "checks": checks}

    # The local artifact store must take a file: a file where its folder should be does not.
    artifacts = service.settings.artifacts_dir
    shutil.rmtree(artifacts)
    artifacts.write_text("not a folder")
    body = problem(service.client.get("/readyz"), 503, "not-ready")
    assert body["checks"]["artifacts"].startswith("artifact folder")
    assert "artifact folder" in body["detail"] and body["checks"]["broker"] == "ok"
    artifacts.unlink()
    artifacts.mkdir()

    # The embedded broker is a folder: gone means not ready.
    for path in sorted(service.settings.broker_dir.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    service.settings.broker_dir.rmdir()
    body = problem(service.client.get("/readyz"), 503, "not-ready")
    assert body["checks"]["database"] == "ok" and body["checks"]["broker"] != "ok"

    def unreachable(url):
        raise ConnectionError("no database")

    monkeypatch.setattr("autofusion.app.services.health.get_engine", unreachable)
    body = problem(service.client.get("/readyz"), 503, "not-ready")
    assert "database unreachable" in body["checks"]["database"]


def _sample(text: str, name: str, **labels: str) -> float | None:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    prefix = f"{name}{{{wanted}}} " if labels else f"{name} "
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.removeprefix(prefix))
    return None


def test_metrics_count_requests_jobs_and_stage_times(make_service, tiny_model):
    service = make_service()
    job_id = service.submit(tiny_model).json()["id"]
    service.submit(tiny_model)
    service.client.get(f"/v1/jobs/{job_id}")
    service.client.get("/v1/jobs/does-not-exist")
    service.client.get(f"/no/such/route/{job_id}")
    with service.db() as session:
        claim_job(session, job_id, "worker-1", lease_s=60)
        timings = {"load": 0.02, "match": 0.3, "check": 1.5}
        finish_job(
            session, job_id, "worker-1", status=JobStatus.succeeded, summary={"timings": timings}
        )

    response = service.client.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    text = response.text
    requests = "autofusion_http_requests_total"
    assert _sample(text, requests, method="POST", route="/v1/optimize", status="202") == 2
    assert _sample(text, requests, method="GET", route="/v1/jobs/{job_id}", status="200") == 1
    assert _sample(text, requests, method="GET", route="/v1/jobs/{job_id}", status="404") == 1
    assert _sample(text, "autofusion_jobs", status="queued") == 1
    assert _sample(text, "autofusion_jobs", status="succeeded") == 1
    assert _sample(text, "autofusion_jobs", status="failed") == 0
    assert _sample(text, "autofusion_job_stage_seconds_count", stage="match") == 1
    assert _sample(text, "autofusion_job_stage_seconds_sum", stage="check") == 1.5
    assert _sample(text, "autofusion_job_duration_seconds_count", status="succeeded") == 1

    # The latency histogram: buckets per route template and status class, never an id.
    seconds = "autofusion_http_request_duration_seconds"
    job_route = {"method": "GET", "route": "/v1/jobs/{job_id}"}
    assert _sample(text, f"{seconds}_count", **job_route, status_class="2xx") == 1
    assert _sample(text, f"{seconds}_count", **job_route, status_class="4xx") == 1
    # (The text format puts ``le`` first.)
    assert _sample(text, f"{seconds}_bucket", le="+Inf", **job_route, status_class="2xx") == 1
    assert _sample(text, f"{seconds}_bucket", le="0.005", **job_route, status_class="2xx") in (0, 1)
    assert _sample(text, f"{seconds}_sum", **job_route, status_class="2xx") > 0
    upload = {"method": "POST", "route": "/v1/optimize", "status_class": "2xx"}
    assert _sample(text, f"{seconds}_count", **upload) == 2
    unmatched = {"method": "GET", "route": "unmatched", "status_class": "4xx"}
    assert _sample(text, f"{seconds}_count", **unmatched) == 1
    assert job_id not in text and "does-not-exist" not in text

    # A job is observed once, however often Prometheus scrapes.
    again = service.client.get("/metrics").text
    assert _sample(again, "autofusion_job_stage_seconds_count", stage="match") == 1

    # Each app has its own registry.
    other = make_service().client.get("/metrics").text
    assert _sample(other, requests, method="POST", route="/v1/optimize", status="202") is None


def test_job_rows_store_what_the_worker_needs(service, tiny_model):
    job_id = service.submit(tiny_model, config={"exclude": ["conv_bn"]}).json()["id"]
    with service.db() as session:
        job = session.get(Job, job_id)
        assert job.status == "queued" and job.config == {"exclude": ["conv_bn"]}
        assert service.app.state.store.exists(job.model_digest)


def test_a_client_cannot_name_the_workers_measurement_folder(service, tiny_model, problem):
    config = {"selection": "measured", "measure_options": {"cache_dir": "/etc"}}
    body = problem(service.submit(tiny_model, config=config), 422, "invalid-config")
    assert "chosen by each worker" in body["detail"]
    assert service.job_count() == 0
