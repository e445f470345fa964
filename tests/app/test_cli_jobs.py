"""``autofusion jobs`` against live servers: one that runs jobs (embedded worker), one
that only queues them (no worker), so that cancel and --timeout are deterministic."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import onnx
import pytest
from cli_server import (
    Server,
    clean_client_env,  # noqa: F401 (autouse: no AUTOFUSION_*, GITHUB_* variables)
    started_server,
)
from cli_server import run_cli as cli

from autofusion.app.cli._exit import (
    EXIT_GATE_FAILED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_QUOTA,
    EXIT_SERVER,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)

REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "tests" / "data" / "resnet" / "resnet50_w8_torchscript.onnx"
FAST_POLL = {"AUTOFUSION_RETRY_AFTER_S": "1"}


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    yield from started_server(tmp_path_factory, "jobs")


@pytest.fixture(scope="module")
def idle(tmp_path_factory) -> Iterator[Server]:
    """A server whose jobs stay queued: nothing works them."""
    yield from started_server(tmp_path_factory, "idle", "--no-embedded-worker")


def _submitted(capsys, srv: Server, key: str) -> str:
    code, out, err = cli(capsys, "submit", RESNET, "--server", srv.url, "--idempotency-key", key)
    assert code == EXIT_OK, err
    return out.rsplit("/v1/jobs/", 1)[1].strip()


@pytest.fixture(scope="module")
def finished(server) -> str:
    """A job of the working server, run to its end (through the API, not the CLI)."""
    with open(RESNET, "rb") as f:
        answer = httpx.post(f"{server.url}/v1/optimize", files={"model": f}, timeout=120)
    assert answer.status_code == 202, answer.text
    return answer.json()["id"]


@pytest.mark.slow
def test_wait_status_list_download_report(capsys, server, finished, tmp_path):
    code, out, err = cli(capsys, "jobs", "wait", finished, "--server", server.url)
    assert code == EXIT_OK, err
    assert f"  job:        {finished} succeeded" in out
    assert f"{server.url}/ui/jobs/{finished}" in out

    code, out, _ = cli(capsys, "jobs", "status", finished, "--server", server.url, "--json")
    job = json.loads(out)
    assert code == EXIT_OK and job["id"] == finished and job["status"] == "succeeded"

    code, out, _ = cli(capsys, "jobs", "list", "--server", server.url)
    assert code == EXIT_OK
    (row,) = [line for line in out.splitlines() if line.startswith(finished)]
    assert row.split()[1] == "succeeded" and row.endswith(RESNET.name)
    code, out, err = cli(capsys, "jobs", "list", "--status", "failed", "--server", server.url)
    assert code == EXIT_OK and finished not in out and "no jobs failed" in err

    fused = tmp_path / "fused.onnx"
    code, _, err = cli(capsys, "jobs", "download", finished, "-o", fused, "--server", server.url)
    assert code == EXIT_OK, err
    model = onnx.load(fused)
    assert "BatchNormalization" not in {node.op_type for node in model.graph.node}
    assert len(model.graph.node) < len(onnx.load(RESNET).graph.node)

    code, out, _ = cli(capsys, "jobs", "report", finished, "--server", server.url)
    report = json.loads(out)
    assert code == EXIT_OK and report["check"]["passed"] is True
    page = tmp_path / "report.html"
    args = ("jobs", "report", finished, "--format", "html", "-o", page, "--server", server.url)
    assert cli(capsys, *args)[0] == EXIT_OK
    assert page.read_text().lstrip().lower().startswith("<!doctype html")


@pytest.mark.slow
def test_the_environment_names_the_server(capsys, server, finished, monkeypatch):
    monkeypatch.setenv("AUTOFUSION_SERVER", server.url)
    code, out, _ = cli(capsys, "jobs", "status", finished)
    assert code == EXIT_OK and f"{finished} succeeded" in out


@pytest.mark.slow
def test_cancel_a_queued_job_then_wait_exits_job_failed(capsys, idle):
    job_id = _submitted(capsys, idle, "cancel-me")
    code, out, err = cli(capsys, "jobs", "wait", job_id, "--timeout", "1", "--server", idle.url)
    assert code == EXIT_TIMEOUT
    assert f"job {job_id} is still queued after 1 s" in err

    code, out, err = cli(capsys, "jobs", "cancel", job_id, "--server", idle.url)
    assert code == EXIT_OK, err
    assert f"{job_id} cancelled" in out
    code, out, err = cli(capsys, "jobs", "wait", job_id, "--server", idle.url)
    assert code == EXIT_JOB_FAILED
    assert f"{job_id} cancelled" in out

    # Cancelled is final: a second cancel is refused (409), a download has no model.
    code, _, err = cli(capsys, "jobs", "cancel", job_id, "--server", idle.url)
    assert code != EXIT_OK and "(409)" in err
    code, _, err = cli(capsys, "jobs", "download", job_id, "--server", idle.url)
    assert code == EXIT_USAGE and "only a succeeded job has a fused model" in err


@pytest.mark.slow
def test_delete_a_queued_job_then_it_is_gone(capsys, idle):
    job_id = _submitted(capsys, idle, "delete-me")
    code, _, err = cli(capsys, "jobs", "delete", job_id, "--server", idle.url)
    assert code == EXIT_OK, err
    assert f"deleted job {job_id}" in err
    code, _, err = cli(capsys, "jobs", "status", job_id, "--server", idle.url)
    assert code == EXIT_USAGE and "(404)" in err
    code, _, err = cli(capsys, "jobs", "delete", job_id, "--server", idle.url)
    assert code == EXIT_USAGE and "(404)" in err


@pytest.mark.slow
def test_a_tenant_at_its_queued_limit_exits_quota_with_the_servers_words(capsys, tmp_path_factory):
    limited = {"AUTOFUSION_MAX_QUEUED_JOBS_PER_TENANT": "1"}
    srv = Server(tmp_path_factory.mktemp("limited") / "data", "--no-embedded-worker", env=limited)
    try:
        srv.wait_healthy()
        first = _submitted(capsys, srv, "first")
        code, _, err = cli(capsys, "submit", RESNET, "--server", srv.url)
        assert code == EXIT_QUOTA, err
        assert "(429): Too many queued jobs: this tenant has 1 job queued" in err
        assert "max_queued_jobs_per_tenant" in err
        # Deleting the queued job frees the place.
        assert cli(capsys, "jobs", "delete", first, "--server", srv.url)[0] == EXIT_OK
        assert cli(capsys, "submit", RESNET, "--server", srv.url)[0] == EXIT_OK
    finally:
        srv.stop()


@pytest.mark.slow
def test_an_unknown_strategy_exits_usage_as_optimize_does(capsys, idle):
    """The server refuses it as 422 invalid-config; the table (and `optimize --strategy`)
    say 2, where a 422 about the model says 3 (issue 27, item 4)."""
    code, _, err = cli(capsys, "submit", RESNET, "--strategy", "nosuch", "--server", idle.url)
    assert code == EXIT_USAGE, err
    assert "there is no strategy named 'nosuch'" in err


@pytest.mark.slow
def test_list_follows_every_page(capsys, idle):
    ids = {_submitted(capsys, idle, f"page-{n}") for n in range(3)}
    code, out, _ = cli(capsys, "jobs", "list", "--limit", "1", "--server", idle.url, "--json")
    assert code == EXIT_OK and len(json.loads(out)) == 1
    code, out, _ = cli(capsys, "jobs", "list", "--limit", "1", "--all", "--server", idle.url)
    listed = [line.split()[0] for line in out.splitlines()[1:]]
    assert ids <= set(listed)
    assert len(listed) == len(set(listed))  # no job twice


@pytest.mark.slow
def test_unknown_job_and_unreachable_server(capsys, idle):
    code, _, err = cli(capsys, "jobs", "status", "no-such-job", "--server", idle.url)
    assert code == EXIT_USAGE and "(404)" in err
    code, _, err = cli(capsys, "jobs", "status", "x", "--server", "http://127.0.0.1:9")
    assert code == EXIT_SERVER and "cannot reach the server" in err
    code, _, err = cli(capsys, "jobs", "status", "x")
    assert code == EXIT_USAGE and "--server is required" in err


def test_a_check_failed_job_waits_to_exit_gate_failed():
    """`jobs wait` exits as `submit --wait` does for the same job (the one table)."""
    from autofusion.app.cli._submit_output import job_exit_code

    problem = "https://autofusion.dev/problems/check-failed"
    assert job_exit_code({"status": "failed", "error_type": problem}) == EXIT_GATE_FAILED
    new_shape = {"status": "failed", "error": {"type": problem, "detail": "outputs differ"}}
    assert job_exit_code(new_shape) == EXIT_GATE_FAILED
    assert job_exit_code({"status": "cancelled"}) == EXIT_JOB_FAILED
    assert job_exit_code({"status": "succeeded"}) == EXIT_OK
