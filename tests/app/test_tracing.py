"""Tracing (issue 27): OpenTelemetry spans for the request, the job's phases in the worker
and the sandbox's phases, in one trace; off unless the standard ``OTEL_*`` settings ask,
and then nothing of OpenTelemetry is imported.

The live test runs ``autofusion serve`` as a user would, configured by environment alone,
exporting over OTLP/HTTP to a receiver in this test that decodes what it gets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from autofusion.app.core import tracing
from autofusion.app.core.queue import RUN_JOB
from autofusion.app.core.tracing import carrier
from autofusion.worker import tasks
from autofusion.worker.celery_app import make_celery
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.sandbox import PHASES_END, TEST_CRASH_ENV
from autofusion.worker.supervise import phase_times
from tests.app.cli_server import REPO, Server
from tests.app.conftest import relu_model
from tests.worker.worker_testing import TENANT, new_env

sdk_trace = pytest.importorskip("opentelemetry.sdk.trace", reason="the tracing extra")
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (  # noqa: E402
    ExportTraceServiceRequest,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import (  # noqa: E402
    InMemorySpanExporter,
)

TINY = relu_model().SerializeToString()  # a job of a second or two
CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"  # the W3C specification's example
CLIENT_PARENT = f"00-{CLIENT_TRACE}-b7ad6b7169203331-01"
WORKER_PHASES = {"autofusion.job.claim", "autofusion.job.plan", "autofusion.job.fetch"}
WORKER_PHASES |= {"autofusion.sandbox", "autofusion.job.store", "autofusion.job.finish"}
SANDBOX_PHASES = {f"autofusion.sandbox.{p}" for p in ("setup", "load", "prepasses", "fuse")}
SANDBOX_PHASES |= {"autofusion.sandbox.check", "autofusion.sandbox.report"}


def _clean_env(**otel: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "AUTOFUSION_"))}
    return {**env, **otel}


# ----- off by default, on with the standard settings ---------------------------------------


@pytest.mark.parametrize(
    ("env", "on"),
    [
        ({}, False),
        ({"OTEL_SERVICE_NAME": "x"}, False),  # a name alone exports nothing
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
    ],
    ids=lambda v: ",".join(f"{k}={x}" for k, x in v.items()) if isinstance(v, dict) else str(v),
)
def test_tracing_is_asked_for_by_the_standard_settings(env: dict[str, str], on: bool) -> None:
    assert tracing.requested(env) is on


OFF_PROBE = """
import sys
from autofusion.worker import execute, supervise, tasks
from autofusion.app.core import tracing
from autofusion.app.core.queue import RUN_JOB
from autofusion.app.core.tracing import carrier
from autofusion.worker import tasks
from autofusion.worker.celery_app import make_celery
with tracing.span("autofusion.job", job_id="j"), tracing.attached({"traceparent": "%s"}):
    tracing.annotate(tenant="t")
assert tracing.carrier() == {} and not tracing.enabled()
worker = sorted(m for m in sys.modules if m.startswith("opentelemetry"))
from fastapi.testclient import TestClient
from autofusion.app.core.config import Settings
from autofusion.app.main import create_app
with TestClient(create_app(Settings(data_dir=sys.argv[1]))) as client:
    assert client.get("/healthz").status_code == 200
api = sorted(m for m in sys.modules if m.startswith("opentelemetry.sdk"))
print(worker, api)
"""


def test_tracing_off_imports_no_opentelemetry(tmp_path: Path) -> None:
    """The worker and the sandbox's parent import none of it; the API (whose FastAPI
    imports the OpenTelemetry API package itself) none of the SDK."""
    probe = OFF_PROBE % CLIENT_PARENT
    done = subprocess.run(
        [sys.executable, "-c", probe, str(tmp_path / "data")],
        cwd=REPO,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[] []"


MISSING_PROBE = """
import logging, sys
sys.modules["opentelemetry.sdk"] = None  # as if the tracing extra were not installed
logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
from autofusion.app.core import tracing
from autofusion.app.core.queue import RUN_JOB
from autofusion.app.core.tracing import carrier
from autofusion.worker import tasks
from autofusion.worker.celery_app import make_celery
with tracing.span("x"):
    pass
with tracing.span("y"):  # decided once: one line, not one a span
    pass
print("enabled", tracing.enabled())
"""


def test_asked_for_without_the_extra_says_what_to_install_once() -> None:
    done = subprocess.run(
        [sys.executable, "-c", MISSING_PROBE],
        cwd=REPO,
        env=_clean_env(OTEL_TRACES_EXPORTER="otlp"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "enabled False"
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, done.stderr
    assert "pip install 'autofusion[tracing]'" in warnings[0]


# ----- the worker and the sandbox, in this process ------------------------------------------


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = sdk_trace.TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.use_provider(provider)
    try:
        yield exporter
    finally:
        tracing.use_provider(None)  # the rest of the session untraced, as by default


def test_a_jobs_worker_and_sandbox_phases_join_the_trace_its_message_carried(
    tmp_path: Path, spans: InMemorySpanExporter
) -> None:
    env = new_env(tmp_path / "data")
    job_id = env.submit(TINY)
    with tracing.span("request") as request:
        headers = tracing.carrier()
    assert headers["traceparent"].split("-")[1] == f"{request.context.trace_id:032x}"

    assert execute_job(env.settings, job_id, "w1", env.store, trace=headers) == Outcome.succeeded

    found = {s.name: s for s in spans.get_finished_spans()}
    assert set(found) >= WORKER_PHASES | SANDBOX_PHASES, sorted(found)
    job = found["autofusion.job"]
    assert job.parent.span_id == request.context.span_id  # the message's span, not a new root
    for span in found.values():
        assert span.context.trace_id == request.context.trace_id, span.name
        if span.name != "request":
            assert span.attributes["autofusion.job_id"] == job_id, span.name
    assert job.attributes["autofusion.tenant"] == TENANT
    assert job.attributes["autofusion.outcome"] == "succeeded"
    sandbox = found["autofusion.sandbox"]
    assert sandbox.attributes["autofusion.status"] == "exited"
    for name in SANDBOX_PHASES:  # measured in the sandbox, inside the worker's span of it
        phase = found[name]
        assert phase.parent.span_id == sandbox.context.span_id, name
        assert phase.attributes["autofusion.tenant"] == TENANT
        assert sandbox.start_time <= phase.start_time <= phase.end_time <= sandbox.end_time
    order = sorted(SANDBOX_PHASES, key=lambda n: found[n].start_time)
    assert [n.rsplit(".", 1)[1] for n in order[:4]] == ["setup", "load", "prepasses", "fuse"]


def test_a_sandbox_that_crashes_keeps_the_phases_it_began(
    tmp_path: Path, spans: InMemorySpanExporter, monkeypatch
) -> None:
    env = new_env(tmp_path / "data")
    job_id = env.submit(TINY, max_attempts=2)
    monkeypatch.setenv(TEST_CRASH_ENV, "segv")
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.requeued
    found = {s.name: s for s in spans.get_finished_spans()}
    assert found["autofusion.sandbox"].attributes["autofusion.returncode"] < 0
    setup = found["autofusion.sandbox.setup"]  # begun before the crash, ended by it
    assert setup.end_time <= found["autofusion.sandbox"].end_time
    assert found["autofusion.job"].parent is None  # no message context: a trace of its own
    assert found["autofusion.job"].attributes["autofusion.outcome"] == "requeued"


def test_a_crashed_attempt_is_sent_again_in_its_requests_trace(
    tmp_path: Path, spans: InMemorySpanExporter, monkeypatch
) -> None:
    """The task reads the context from its message's headers and sends the job again
    (requeued after a crash) inside it."""
    env = new_env(tmp_path / "data")
    job_id = env.submit(TINY, max_attempts=2)
    monkeypatch.setenv(TEST_CRASH_ENV, "segv")
    sent: list[tuple[str, dict[str, str]]] = []
    monkeypatch.setattr(
        tasks, "enqueue_job", lambda _app, job, countdown=None: sent.append((job, carrier()))
    )
    task = make_celery(env.settings).tasks[RUN_JOB]
    result = task.apply(args=[job_id], headers={"traceparent": CLIENT_PARENT})
    # an eager result: nothing blocks (Celery refuses .get() once a worker of this
    # process, an embedded one of an earlier test, has marked joins as blocking)
    assert result.get(disable_sync_subtasks=False) == "requeued"
    job = next(s for s in spans.get_finished_spans() if s.name == "autofusion.job")
    assert f"{job.context.trace_id:032x}" == CLIENT_TRACE
    assert [(sent_id, h["traceparent"].split("-")[1]) for sent_id, h in sent] == [
        (job_id, CLIENT_TRACE)
    ]


def test_the_sandboxs_phase_file_is_read_as_untrusted(tmp_path: Path) -> None:
    path = tmp_path / "phases.jsonl"
    lines = [
        {"phase": "load", "at_ns": 100},
        {"phase": "fuse", "at_ns": 250},
        {"phase": "check", "at_ns": 200},  # back in time: the rest is not believed
        {"phase": "report", "at_ns": 300},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert phase_times(path, 1000) == [("load", 100, 250), ("fuse", 250, 1000)]
    path.write_text(json.dumps({"phase": "x" * 500, "at_ns": 1}) + "\n")
    assert phase_times(path, 1000) == []
    ended = [{"phase": "load", "at_ns": 10}, {"phase": PHASES_END, "at_ns": 20}]
    path.write_text("".join(json.dumps(line) + "\n" for line in ended))
    assert phase_times(path, 1000) == [("load", 10, 20)]
    assert phase_times(tmp_path / "missing.jsonl", 1000) == []


# ----- one job through a live server, exported over OTLP ------------------------------------


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP trace receiver: each POST to /v1/traces, decoded, kept."""

    received: list[dict[str, Any]]

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        request = ExportTraceServiceRequest.FromString(body)
        for resource in request.resource_spans:
            for scope in resource.scope_spans:
                self.received.extend(_span_dict(span) for span in scope.spans)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def _span_dict(span: Any) -> dict[str, Any]:
    return {
        "name": span.name,
        "trace_id": span.trace_id.hex(),
        "span_id": span.span_id.hex(),
        "parent": span.parent_span_id.hex(),
        "attributes": {a.key: _value(a.value) for a in span.attributes},
    }


def _value(value: Any) -> Any:
    kind = value.WhichOneof("value")  # OTLP's AnyValue: string_value, int_value, ...
    return getattr(value, kind) if kind else None


@pytest.fixture
def receiver() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []
    handler = type("Receiver", (_Receiver,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", received
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow
def test_one_job_through_a_live_server_is_one_trace(tmp_path: Path, receiver) -> None:
    endpoint, received = receiver
    otel = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint,  # alone: tracing on, over OTLP/HTTP
        "OTEL_SERVICE_NAME": "autofusion-test",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "AUTOFUSION_RETRY_AFTER_S": "1",
    }
    server = Server(tmp_path / "data", env=otel)
    try:
        server.wait_healthy()
        job_id = _submit_and_wait(server.url)
        names = WORKER_PHASES | SANDBOX_PHASES | {"autofusion.job", "autofusion.enqueue"}
        names.add("autofusion.api_sandbox")
        spans = _wait_for_spans(received, names)
    finally:
        server.stop()
    request = next(s for s in spans if s["name"] == "POST /v1/optimize")
    assert request["parent"] == CLIENT_PARENT.split("-")[2]  # the client's traceparent
    assert request["attributes"]["autofusion.request_id"] == "ci-run-42"
    assert request["attributes"]["autofusion.job_id"] == job_id
    assert request["attributes"]["autofusion.tenant"] == "default"  # no keys: the default
    ours = [s for s in spans if s["name"].startswith("autofusion.")]
    assert {s["trace_id"] for s in ours + [request]} == {CLIENT_TRACE}
    for span in ours:
        assert span["attributes"].get("autofusion.request_id") == "ci-run-42", span
        if span["name"] != "autofusion.api_sandbox":  # before the job was made
            assert span["attributes"]["autofusion.job_id"] == job_id, span["name"]
    by_name = {s["name"]: s for s in ours}
    assert by_name["autofusion.enqueue"]["parent"] == request["span_id"]
    check = by_name["autofusion.api_sandbox"]  # the upload's model check
    assert (check["parent"], check["attributes"]["autofusion.task"]) == (
        request["span_id"],
        "inspect",
    )
    assert by_name["autofusion.job"]["parent"] == by_name["autofusion.enqueue"]["span_id"]


def _submit_and_wait(url: str) -> str:
    model = relu_model().SerializeToString()
    headers = {"traceparent": CLIENT_PARENT, "X-Request-ID": "ci-run-42"}
    files = {"model": ("relu.onnx", model, "application/octet-stream")}
    response = httpx.post(f"{url}/v1/optimize", files=files, headers=headers, timeout=30)
    assert response.status_code == 202, response.text
    job_id = response.json()["id"]
    for _ in range(600):
        job = httpx.get(f"{url}/v1/jobs/{job_id}", timeout=10).json()
        if job["status"] in ("succeeded", "failed"):
            assert job["status"] == "succeeded", job
            return job_id
        threading.Event().wait(0.1)
    pytest.fail(f"job {job_id} still {job['status']} after 60 s")


def _wait_for_spans(received: list[dict[str, Any]], names: set[str]) -> list[dict[str, Any]]:
    for _ in range(100):  # the batch processor exports every 100 ms
        if names <= {s["name"] for s in received} and any(
            s["name"] == "POST /v1/optimize" for s in received
        ):
            return list(received)
        threading.Event().wait(0.1)
    pytest.fail(f"spans missing: {sorted(names - {s['name'] for s in received})}")
