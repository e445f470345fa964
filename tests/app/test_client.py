"""``autofusion.app.client``, the typed client of the base install, against live servers:
one that runs jobs (embedded worker), one that only queues them (no worker), so that a
timed-out wait and a cancel are deterministic."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import pytest
from cli_server import Server, started_server

from autofusion.app.client import (
    Client,
    Job,
    RequestRefused,
    Unreachable,
    WaitTimeout,
)
from autofusion.fusion_core.testing import conv_bn_relu

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from started_server(tmp_path_factory, "client")


@pytest.fixture(scope="module")
def idle(tmp_path_factory) -> Iterator[Server]:
    """A server whose jobs stay queued: nothing works them."""
    yield from started_server(tmp_path_factory, "client-idle", "--no-embedded-worker")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "conv_bn_relu.onnx"
    onnx.save_model(conv_bn_relu(), path)
    return path


def test_submit_wait_download_report(server: Server, model: Path, tmp_path: Path) -> None:
    seen: list[Job] = []
    with Client(server.url, poll_interval=0.2) as client:
        job = client.submit(model, config={"target": "onnxruntime"})
        assert isinstance(job, Job) and job.status == "queued" and not job.done
        assert job.url == f"{server.url}/v1/jobs/{job.id}"
        done = client.wait(job, timeout=120, on_update=seen.append)
        assert done.succeeded and done.done and done.error is None, done.data
        assert seen and seen[-1].status == "succeeded"
        assert done.data["config"]["target"] == "onnxruntime"

        fused = client.download(done, "model", tmp_path / "out" / "fused.onnx")
        ops = {n.op_type for n in onnx.load(fused).graph.node}
        assert "BatchNormalization" not in ops and fused.with_suffix(".onnx.part").exists() is False
        report = client.report(done)
        assert report["check"]["passed"] is True
        # the same as the downloaded file, through the id alone
        saved = client.download(done.id, "report", tmp_path / "report.json")
        assert json.loads(saved.read_text())["check"] == report["check"]
        page = client.download(done, "report.html", tmp_path / "report.html")
        assert "<html" in page.read_text().lower()


def test_the_same_idempotency_key_gives_the_same_job(idle: Server, model: Path) -> None:
    with Client(idle.url) as client:
        first = client.submit(model, idempotency_key="client-test-same")
        again = client.submit(model, idempotency_key="client-test-same")
        other = client.submit(model)  # by default each call is a new job
    assert again.id == first.id and other.id != first.id


def test_a_refusal_carries_the_problem_fields(server: Server, tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"this is not an ONNX model")
    with Client(server.url) as client, pytest.raises(RequestRefused) as refused:
        client.submit(junk)
    exc = refused.value
    assert exc.status == 422 and exc.slug == "invalid-model", exc.problem
    assert exc.type.endswith("/invalid-model") and exc.title and exc.detail
    assert exc.problem["status"] == 422 and exc.method == "POST" and exc.path == "/v1/optimize"
    assert str(exc).startswith("the server refused POST /v1/optimize (422): ")


def test_an_unknown_job_is_a_404_problem(server: Server) -> None:
    with Client(server.url) as client, pytest.raises(RequestRefused) as refused:
        client.job("no-such-job")
    assert refused.value.status == 404 and refused.value.problem.get("type")


def test_a_wait_that_runs_out_then_a_cancel(idle: Server, model: Path) -> None:
    with Client(idle.url, poll_interval=0.2) as client:
        job = client.submit(model)
        with pytest.raises(WaitTimeout) as waited:
            client.wait(job, timeout=0.5)
        assert waited.value.job["status"] == "queued"
        assert f"follow it at {job.url}" in str(waited.value)
        assert client.cancel(job).status in ("cancelled", "queued")
        assert client.wait(job.id, timeout=30).status == "cancelled"


def test_an_unreachable_server(monkeypatch) -> None:
    monkeypatch.setattr("autofusion.app.client._http.time.sleep", lambda s: None)
    with Client("http://127.0.0.1:9") as client, pytest.raises(Unreachable, match="cannot reach"):
        client.job("x")


def test_the_callback_url_is_a_config_option(model: Path) -> None:
    """Sent as the job's ``callback_url`` option, beside the others."""
    sent: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        body = request.read().decode("latin-1")
        config = body.split('name="config"', 1)[1].split("\r\n\r\n", 1)[1].split("\r\n--")[0]
        sent.append(json.loads(config))
        return httpx.Response(202, json={"id": "j1", "status": "queued"})

    client = Client("http://testserver")
    client._transport.http = httpx.Client(
        base_url="http://testserver", transport=httpx.MockTransport(handler)
    )
    job = client.submit(model, config={"profile": True}, callback_url="https://ci.example/hook")
    assert job.url == "http://testserver/v1/jobs/j1"
    assert sent == [{"profile": True, "callback_url": "https://ci.example/hook"}]


def test_not_an_url() -> None:
    with pytest.raises(ValueError, match="http"):
        Client("127.0.0.1:8000")


def test_the_client_imports_nothing_of_the_server_or_the_engine() -> None:
    """What the base install needs: the standard library and httpx (tests/test_wheel_client.py
    installs it for real)."""
    probe = "import json, sys, autofusion.app.client; print(json.dumps(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO
    )
    loaded = {name.partition(".")[0] for name in json.loads(done.stdout)}
    heavy = {"pydantic", "yaml", "onnx", "numpy", "fastapi", "sqlalchemy", "celery"} & loaded
    assert not heavy
    modules = set(json.loads(done.stdout))
    assert not any(m.startswith(("autofusion.fusion_core", "autofusion.app.core")) for m in modules)
