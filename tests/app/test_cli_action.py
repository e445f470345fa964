"""The GitHub Action (action.yml) and ``submit --github-output``: the step's script run
as a runner runs it (bash -eo pipefail, inputs as variables) against a live server, and
the outputs file holds what the job and its report say."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import yaml
from cli_server import Server
from report_testing import write_model

from autofusion.app.cli import main
from autofusion.app.cli._exit import EXIT_GATE_FAILED, EXIT_OK, EXIT_SERVER
from autofusion.app.cli._submit_output import github_outputs
from autofusion.fusion_core.report import read_report

REPO = Path(__file__).resolve().parents[2]
ACTION = yaml.safe_load((REPO / "action.yml").read_text())
_INPUT = re.compile(r"\$\{\{\s*inputs\.([\w-]+)\s*\}\}")


def read_outputs(path: Path) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in path.read_text().splitlines()]
    return dict(pairs)


def submit_step() -> dict:
    (step,) = [s for s in ACTION["runs"]["steps"] if s.get("id") == "submit"]
    return step


def run_action(inputs: dict[str, str], workdir: Path) -> tuple[int, dict[str, str], str]:
    """The submit step's script with these inputs (the rest their defaults), `autofusion`
    on PATH being this checkout's CLI; (exit code, the outputs file, the log)."""
    given = {name: spec.get("default", "") for name, spec in ACTION["inputs"].items()}
    given.update(inputs)
    step = submit_step()
    env = {
        key: _INPUT.sub(lambda m: given[m.group(1)], value) for key, value in step["env"].items()
    }
    shim = workdir / "bin" / "autofusion"
    shim.parent.mkdir(exist_ok=True)
    shim.write_text(
        f'#!/bin/sh\nexec "{sys.executable}" -c "import sys; from autofusion.app.cli import main; '
        f'sys.exit(main())" "$@"\n'
    )
    shim.chmod(0o755)
    outputs = workdir / "github_output"
    outputs.write_text("")
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("AUTOFUSION_")}
    done = subprocess.run(
        ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]],
        env={
            **clean,
            **env,
            "PATH": f"{shim.parent}:{os.environ['PATH']}",
            "PYTHONPATH": str(REPO),
            "GITHUB_OUTPUT": str(outputs),
        },
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return done.returncode, read_outputs(outputs), done.stdout + done.stderr


def test_the_action_is_composite_and_names_what_submit_writes():
    assert ACTION["runs"]["using"] == "composite"
    assert {"model", "server", "api-key", "max-abs-diff", "min-speedup"} <= set(ACTION["inputs"])
    written = set(github_outputs(None, 0))
    assert set(ACTION["outputs"]) == written
    for name, spec in ACTION["outputs"].items():
        assert spec["value"] == f"${{{{ steps.submit.outputs.{name} }}}}"
    # Every input the script reads is declared, and every declared one is used.
    used = set(re.findall(r"inputs\.([\w-]+)", yaml.safe_dump(ACTION["runs"])))
    assert used == set(ACTION["inputs"])


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("action") / "data", env={"AUTOFUSION_RETRY_AFTER_S": "1"})
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


@pytest.mark.slow
def test_the_action_against_a_live_server(server, tmp_path):
    model = write_model(tmp_path, "speedy.onnx", width=32)
    inputs = {
        "model": str(model),
        "server": server.url,
        "max-abs-diff": "1e-3",
        "min-speedup": "0.01",
        "output": str(tmp_path / "fused.onnx"),
    }
    code, outputs, log = run_action(inputs, tmp_path)
    assert code == EXIT_OK, log
    job = httpx.get(f"{server.url}/v1/jobs/{outputs['job-id']}").json()
    report = read_report(httpx.get(f"{server.url}/v1/jobs/{job['id']}/report").json())
    assert report.speed is not None and report.max_abs_diff is not None
    assert outputs == {
        "job-id": job["id"],
        "status": "succeeded",
        "exit-code": "0",
        "speedup": f"{report.speed.speedup:.4g}",
        "max-abs-diff": f"{report.max_abs_diff:.6g}",
        "check": "passed",
        "fallback-dropped": "",
        "job-url": f"{server.url}/v1/jobs/{job['id']}",
        "page-url": f"{server.url}/ui/jobs/{job['id']}",
        "report-url": f"{server.url}/ui/jobs/{job['id']}/report.html",
    }
    assert (tmp_path / "fused.onnx").stat().st_size > 0
    page = httpx.get(outputs["report-url"])  # the report page is there, as HTML, inline
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-disposition"].startswith("inline"), page.headers

    # A gate that fails fails the step with its code, and the outputs are still there.
    code, again, log = run_action({**inputs, "min-speedup": "1000"}, tmp_path)
    assert code == EXIT_GATE_FAILED, log
    assert again == {**outputs, "exit-code": str(EXIT_GATE_FAILED)}


@pytest.mark.slow
def test_the_action_sends_data_files_and_writes_them_back(server, tmp_path):
    """A model whose weights are in a data file (``data``, one path per line): the fused
    model comes back with its own data file beside ``output``, and computes the same."""
    from test_model_data_downloads import mlp
    from test_model_data_downloads import outputs as model_outputs

    model = mlp(tmp_path, external=True)
    inputs = {
        "model": str(model),
        "data": f"\n{tmp_path / 'w.bin'}\n",
        "server": server.url,
        "output": str(tmp_path / "out" / "m.fused.onnx"),
    }
    code, outputs, log = run_action(inputs, tmp_path)
    assert code == EXIT_OK and outputs["check"] == "passed", log
    job = httpx.get(f"{server.url}/v1/jobs/{outputs['job-id']}").json()
    assert [f["name"] for f in job["data_files"]] == ["w.bin"]
    assert (tmp_path / "out" / "m.fused.onnx.data").is_file()
    fused = model_outputs(tmp_path / "out" / "m.fused.onnx")
    assert abs(fused - model_outputs(model)).max() <= 1e-5


def test_report_url_is_the_report_page_when_the_job_has_one():
    """report-url: the dashboard's report page (what a PR comment links to: it opens in
    the browser), absolute; empty while the job has no report.html."""
    base = "/v1/jobs/j1"
    job = {"id": "j1", "status": "succeeded", "links": {"self": base, "report": f"{base}/report"}}
    outcome = SimpleNamespace(
        job=job, url=f"http://af{base}", server="http://af", report=None, gates=[]
    )
    assert github_outputs(outcome, 0)["report-url"] == ""
    job["links"]["artifacts"] = {"report.html": f"{base}/artifacts/report.html"}
    assert github_outputs(outcome, 0)["report-url"] == "http://af/ui/jobs/j1/report.html"


def test_outputs_when_the_server_cannot_be_reached(capsys, tmp_path, monkeypatch):
    """No job: the exit code is there, the job's facts are empty; GITHUB_OUTPUT is the
    default file."""
    model = tmp_path / "m.onnx"
    model.write_bytes(b"never parsed")
    outputs = tmp_path / "out"
    monkeypatch.setenv("GITHUB_OUTPUT", str(outputs))
    code = main(["submit", str(model), "--server", "http://127.0.0.1:9", "--wait"])
    assert code == EXIT_SERVER
    assert read_outputs(outputs) == {**dict.fromkeys(github_outputs(None, 0), ""), "exit-code": "5"}
