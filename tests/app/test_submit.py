"""``autofusion submit`` (the CI client), ``serve`` and ``keys``.

Three layers:
- the client's pieces and its exit codes with no server (usage 2, unreachable 5);
- the whole submit flow against an in-process fake that speaks the API contract
  (202 + Location + Retry-After, ETag/304, report, model, problem+json), so polling,
  gates, timeouts and the GitHub step summary are checked exactly; the reports it
  serves are real ``build_report`` output (tests/app/report_testing.py), and the job
  summary the worker's own ``summarize`` of them, never keys written by hand;
- end to end against a real ``autofusion serve`` subprocess in embedded mode, the speed
  gate included (a real profiled job).

Submit exits with the CLI's one table (app/cli/_exit.py): 0 ok, 1 quality gate (the
server's check included), 2 usage, 3 bad model, 4 job failed, 5 unreachable, 6 timeout.
"""

from __future__ import annotations

import io
import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import numpy as np
import onnx
import pytest
from cli_server import (
    FAST_POLL,
    Server,
    clean_client_env,  # noqa: F401 (autouse: no AUTOFUSION_*, GITHUB_* variables)
    free_port,
    start_cli,
    stop_process,
)
from report_testing import paired, real_report, write_model

from autofusion.app.cli import main
from autofusion.app.cli import serve as serve_cmd
from autofusion.app.cli._exit import (
    EXIT_BAD_INPUT,
    EXIT_GATE_FAILED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_SERVER,
    EXIT_TIMEOUT,
    EXIT_USAGE,
)
from autofusion.app.cli._reuse import ServerFacts
from autofusion.app.cli._submit_output import Progress, evaluate_gates, speed_dict
from autofusion.app.cli.submit import Upload, idempotency_key
from autofusion.app.core.db import session_scope
from autofusion.app.migrate import upgrade
from autofusion.app.services.auth import authenticate
from autofusion.fusion_core.report import read_report
from autofusion.fusion_core.validate import make_session
from autofusion.worker.plan import Plan, summarize
from autofusion.worker.snapshots import CompiledSnapshot

PROBLEM = "https://autofusion.dev/problems/"
REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "tests" / "data" / "resnet" / "resnet50_w8_torchscript.onnx"


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> dict[str, dict]:
    """Real reports of the Conv+BN+Relu test model, by what they show."""
    folder = tmp_path_factory.mktemp("reports")
    built = {
        "plain": real_report(folder / "plain"),
        "profiled": real_report(folder / "profiled", profile=True),
        "slower": real_report(folder / "slower", paired=paired("slower")),
        "mismatch": real_report(folder / "mismatch", check={"rtol": 0, "atol": 0}, strict=True),
        "fell-back": real_report(folder / "fell-back", check={"rtol": 0, "atol": 0}),
        "unchecked": real_report(folder / "unchecked", check={"enabled": False}),
    }
    assert read_report(built["plain"]).max_abs_diff > 0  # the gates below compare to it
    assert read_report(built["mismatch"]).check_failure == "mismatch"
    assert read_report(built["fell-back"]).fallback_reason is not None
    assert read_report(built["unchecked"]).check_passed is None
    assert read_report(built["profiled"]).speed.runs > 0
    # A report written before the `speed` entry: the reader takes the profile's ratio.
    older = json.loads(json.dumps(built["profiled"]))
    del older["speed"]
    built["before-speed-entry"] = older
    return built


@pytest.fixture(autouse=True)
def _root_logging_restored():
    """``serve`` run in-process replaces the root logger's handlers (configure_logging)
    with one on the stderr of that moment, a capture that closes with the test: put the
    handlers back, so that no later test logs "--- Logging error ---" into its output."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def cli(capsys, *args: str | Path) -> tuple[int, str, str]:
    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def line(label: str, value: str) -> str:
    """A line of the text summary."""
    return f"  {label + ':':<20}{value}"


# ----- the client's pieces, no server ------------------------------------------------------


@pytest.fixture
def model_file(tmp_path) -> Path:
    path = tmp_path / "m.onnx"
    path.write_bytes(b"not really onnx, the client never parses it")
    return path


def test_idempotency_key_depends_on_content_only(tmp_path, model_file):
    key = idempotency_key(Upload(model_file, [], {"target": "generic"}))
    assert key == idempotency_key(Upload(model_file, [], {"target": "generic"}))
    elsewhere = tmp_path / "other" / "renamed.onnx"
    elsewhere.parent.mkdir()
    shutil.copy(model_file, elsewhere)
    assert idempotency_key(Upload(elsewhere, [], {"target": "generic"})) == key
    # Key order in the config does not matter; the values do.
    a = idempotency_key(Upload(model_file, [], {"target": "generic", "strategy": "s"}))
    b = idempotency_key(Upload(model_file, [], {"strategy": "s", "target": "generic"}))
    assert a == b != key
    assert idempotency_key(Upload(model_file, [], {"target": "onnxruntime"})) != key
    data = tmp_path / "m.onnx.data"
    data.write_bytes(b"weights")
    with_data = idempotency_key(Upload(model_file, [data], {"target": "generic"}))
    assert with_data != key
    data.write_bytes(b"other weights")
    assert idempotency_key(Upload(model_file, [data], {"target": "generic"})) != with_data
    model_file.write_bytes(b"changed")
    assert idempotency_key(Upload(model_file, [], {"target": "generic"})) != key
    assert key.startswith("autofusion-") and len(key) <= 200


def test_idempotency_key_covers_the_server_registry_and_strategy(model_file):
    """Issue 27: the same inputs after a registry change, a strategy change or an upgrade
    are a new request, not a replay of a job those changes would not have made."""
    upload = Upload(model_file, [], {"strategy": "vision"})
    facts = ServerFacts("1.0", 7, "vision", 2)
    key = idempotency_key(upload, facts)
    assert key == idempotency_key(upload, ServerFacts("1.0", 7, "vision", 2))
    assert key != idempotency_key(upload)  # the inputs alone
    for changed in (
        ServerFacts("1.0", 8, "vision", 2),  # a pattern disabled: registry v8
        ServerFacts("1.0", 7, "vision", 3),  # the strategy edited
        ServerFacts("1.1", 7, "vision", 2),  # the server upgraded
    ):
        assert idempotency_key(upload, changed) != key, changed
    # A server without /v1/info tells nothing: the inputs' key, as before it.
    assert idempotency_key(upload, ServerFacts(strategy="vision")) == idempotency_key(upload)


@pytest.mark.parametrize(
    "args, message",
    [
        pytest.param([], "--server is required", id="no-server"),
        pytest.param(["--server", "127.0.0.1:8000"], "http(s) URL", id="server-not-url"),
        pytest.param(["--server", "http://x", "-o", "f.onnx"], "need(s) --wait", id="o-no-wait"),
        pytest.param(
            ["--server", "http://x", "--max-abs-diff", "1"], "need(s) --wait", id="gate-no-wait"
        ),
        pytest.param(
            ["--server", "http://x", "--min-speedup", "1.1"], "need(s) --wait", id="speed-no-wait"
        ),
        pytest.param(
            ["--server", "http://x", "--min-speedup", "0", "--wait"], "above 0", id="speed-0"
        ),
        pytest.param(
            ["--server", "http://x", "--strategy", "missing.yaml"],
            "no such strategy file",
            id="strategy-file-missing",
        ),
        pytest.param(
            ["--server", "http://x", "--max-abs-diff", "-1", "--wait"], "0 or above", id="neg"
        ),
        pytest.param(["--server", "http://x", "--timeout", "0", "--wait"], "above 0", id="t0"),
        pytest.param(["--server", "http://x", "--target", "tpu"], "invalid choice", id="target"),
    ],
)
def test_usage_errors_exit_2(capsys, model_file, args, message):
    code, out, err = cli(capsys, "submit", model_file, *args)
    assert code == 2
    assert message in err
    assert out == ""


def test_missing_model_exits_3(capsys, tmp_path):
    code, _, err = cli(capsys, "submit", tmp_path / "nope.onnx", "--server", "http://x")
    assert code == EXIT_BAD_INPUT
    assert "no such file" in err


def test_unreachable_server_exits_5(capsys, model_file, tmp_path, monkeypatch):
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    port = free_port()  # nothing listens there
    code, out, err = cli(capsys, "submit", model_file, "--server", f"http://127.0.0.1:{port}")
    assert code == EXIT_SERVER
    assert "cannot reach the server" in err
    assert out == ""
    assert "cannot reach the server" in summary.read_text()


@pytest.mark.parametrize(
    "strategy, content, expected",
    [
        pytest.param("vision", None, {"strategy": "vision"}, id="name"),
        pytest.param("s.json", '{"target": "onnxruntime"}', {"target": "onnxruntime"}, id="json"),
        pytest.param(
            "s.yaml",
            "exclude: [pad_conv]\ncheck: {atol: 0.01}\n",
            {"exclude": ["pad_conv"], "check": {"atol": 0.01}},
            id="yaml",
        ),
    ],
)
def test_strategy_name_or_file(tmp_path, model_file, strategy, content, expected):
    from autofusion.app.cli.submit import build_upload

    if content is not None:
        (tmp_path / strategy).write_text(content)
        strategy = str(tmp_path / strategy)
    args = _args(model_file, "--strategy", strategy)
    assert build_upload(args).config == expected
    args = _args(model_file, "--strategy", strategy, "--target", "generic")
    assert build_upload(args).config == {**expected, "target": "generic"}


@pytest.mark.parametrize(
    "options, expected",
    [
        pytest.param([], {}, id="default"),
        pytest.param(["--profile"], {"profile": True}, id="profile"),
        pytest.param(["--min-speedup", "1.1", "--wait"], {"profile": True}, id="gate-implies"),
        pytest.param(
            ["--profile", "--target", "onnxruntime"],
            {"target": "onnxruntime", "profile": True},
            id="profile-and-target",
        ),
        pytest.param(["--measure"], {"measure": True}, id="measure"),
        pytest.param(
            ["--measure", "--measure-budget", "20"],
            {"measure": True, "measure_options": {"budget_s": 20.0}},
            id="measure-budget",
        ),
    ],
)
def test_profile_and_the_speed_gate_ask_the_server_to_profile(model_file, options, expected):
    from autofusion.app.cli.submit import build_upload

    assert build_upload(_args(model_file, *options)).config == expected


def test_a_measure_budget_without_measure_is_a_usage_error(model_file):
    from autofusion.app.cli._client import ClientError
    from autofusion.app.cli.submit import build_upload

    with pytest.raises(ClientError, match="needs --measure") as caught:
        build_upload(_args(model_file, "--measure-budget", "5"))
    assert caught.value.code == EXIT_USAGE


def _args(*argv: str | Path):
    from autofusion.app.cli import build_parser

    return build_parser().parse_args(["submit", *map(str, argv), "--server", "http://x"])


def test_strategy_file_must_be_a_mapping(capsys, tmp_path, model_file):
    bad = tmp_path / "s.yaml"
    bad.write_text("- a\n- b\n")
    code, _, err = cli(capsys, "submit", model_file, "--server", "http://x", "--strategy", bad)
    assert code == 2
    assert "mapping" in err


def _speedup(factor: float):
    """A --min-speedup of ``factor`` times the speedup the report measured."""
    return lambda report: read_report(report).speed.speedup * factor


def _diff(factor: float):
    """A --max-abs-diff of ``factor`` times the check's max abs diff."""
    return lambda report: read_report(report).max_abs_diff * factor


@pytest.mark.parametrize(
    "name, max_abs_diff, min_speedup, profiled, verdicts, words",
    [
        pytest.param("plain", None, None, False, {"check": True}, "matches", id="check-only"),
        pytest.param(
            "plain", _diff(1), None, False, {"check": True, "max-abs-diff": True}, "<=",
            id="diff-equal",
        ),
        pytest.param(
            "plain", _diff(0.5), None, False, {"check": True, "max-abs-diff": False}, ">",
            id="diff-above",
        ),
        pytest.param(
            "unchecked", 1.0, None, False, {"max-abs-diff": False}, "skipped the numerical check",
            id="check-skipped",
        ),
        pytest.param(
            "mismatch", None, None, False, {"check": False}, "does not match the original",
            id="check-failed",
        ),
        pytest.param(
            "plain", None, 1.1, False, {"check": True, "min-speedup": False},
            "the job was not profiled", id="not-profiled",
        ),
        pytest.param(
            "plain", None, 1.1, True, {"check": True, "min-speedup": False},
            "the job was profiled but its report has no speed measurement",
            id="profiled-without-speed",
        ),
        pytest.param(
            "profiled", None, _speedup(0.9), True, {"check": True, "min-speedup": True},
            "paired runs", id="speed-ok",
        ),
        pytest.param(
            "profiled", None, _speedup(1), True, {"check": True, "min-speedup": True}, ">=",
            id="speed-equal",
        ),
        pytest.param(
            "profiled", None, _speedup(1.1), True, {"check": True, "min-speedup": False}, "<",
            id="speed-low",
        ),
        pytest.param(
            "before-speed-entry", None, _speedup(1.1), True,
            {"check": True, "min-speedup": False}, "ORT_ENABLE_ALL", id="older-report",
        ),
        pytest.param(
            "slower", None, 0.7, True, {"check": True, "min-speedup": True}, "+25% slower",
            id="slower-above-the-bar",
        ),
        pytest.param(
            "slower", None, 1.0, True, {"check": True, "min-speedup": False},
            "measured speedup 0.800x < 1x", id="slower",
        ),
    ],
)  # fmt: skip
def test_gates(reports, name, max_abs_diff, min_speedup, profiled, verdicts, words):
    report = reports[name]
    max_abs_diff = max_abs_diff(report) if callable(max_abs_diff) else max_abs_diff
    min_speedup = min_speedup(report) if callable(min_speedup) else min_speedup
    gates = evaluate_gates(report, max_abs_diff, min_speedup, profiled=profiled)
    assert {g.name: g.passed for g in gates} == verdicts
    assert all(g.message for g in gates)
    assert words in gates[-1].message
    speed = read_report(report).speed
    if min_speedup is not None and speed is not None:
        # The message names the measured speedup, the verdict, the interval and the runs.
        message = gates[-1].message
        assert f"measured speedup {speed.speedup:.3f}x" in message
        assert speed.describe() in message


def test_progress_bar_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Tty()
    progress = Progress(stream)
    progress.update({"id": "j", "status": "running", "stage": "validate", "progress": 0.5})
    progress.update({"id": "j", "status": "succeeded", "stage": "succeeded", "progress": 1.0})
    progress.close()
    text = stream.getvalue()
    assert "\r[############............]  50%  running: validate" in text
    assert "100%  succeeded" in text
    assert text.endswith("\n")


# ----- the full flow against a fake server that speaks the contract ------------------------


class FakeApi:
    """The API contract in ~100 lines: jobs advance one state per GET of the job."""

    def __init__(self, report: dict) -> None:
        self.requests: list[dict] = []
        self.jobs: dict[str, dict] = {}
        self.by_key: dict[str, str] = {}
        self.states = [
            ("queued", "queued", 0.0),
            ("running", "optimize", 0.3),
            ("running", "optimize", 0.3),
            ("running", "validate", 0.8),
            ("succeeded", "succeeded", 1.0),
        ]
        self.error: str | dict | None = None  # a string before problem objects
        self.error_type: str | None = None  # the problem slug the string came with
        self.report = report
        self.retry_after = "0"
        self.post_answer: tuple[int, dict] | None = None
        self.post_raw: bytes | None = None
        self.not_modified = 0
        # GET /v1/info (None: a server older than it, 404); its requests kept apart
        self.info: dict | None = {"version": "9.9.9", "registry_version": 7, "strategies": {}}
        self.info_requests = 0

    def job(self, job_id: str) -> dict:
        state = self.jobs[job_id]
        index = min(state["polls"], len(self.states) - 1)
        status, stage, progress = self.states[index]
        revision = len(dict.fromkeys(self.states[: index + 1]))  # distinct states so far
        base = f"/v1/jobs/{job_id}"
        return {
            "id": job_id,
            "status": status,
            "stage": stage,
            "progress": progress,
            "revision": revision,
            "registry_version": 1,
            "created_at": "2026-12-06T07:00:00Z",
            "config": self.config(job_id),
            # What the worker writes, from the same report.
            "summary": summarize(self.report, PLAN, 1, 0.5) if status == "succeeded" else None,
            "error": self.error if status == "failed" else None,
            "error_type": PROBLEM + self.error_type if self.error_type else None,
            "links": {
                "self": base,
                "model": f"{base}/model",
                "report": f"{base}/report",
                "artifacts": {"report.html": f"{base}/artifacts/report.html"},
            },
        }

    def config(self, job_id: str) -> dict:
        """The config the job was created with (the upload's ``config`` field)."""
        body = self.jobs[job_id]["body"]
        start = body.index(b'name="config"')
        text = body[start:].split(b"\r\n\r\n", 1)[1].split(b"\r\n--", 1)[0]
        return json.loads(text)

    def handler(self) -> type[BaseHTTPRequestHandler]:
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _send(self, status: int, body: bytes, headers: dict) -> None:
                self.send_response(status)
                for name, value in headers.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _json(self, status: int, data: dict, **headers: str) -> None:
                media = "application/problem+json" if status >= 400 else "application/json"
                headers = {"Content-Type": media, **headers}
                self._send(status, json.dumps(data).encode(), headers)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                api.requests.append({"method": "POST", "headers": dict(self.headers), "body": body})
                if api.post_answer is not None:
                    self._json(*api.post_answer)
                    return
                if api.post_raw is not None:
                    self._send(200, api.post_raw, {"Content-Type": "text/html"})
                    return
                key = self.headers.get("Idempotency-Key")
                replayed = key in api.by_key
                job_id = api.by_key.get(key) or f"job-{len(api.jobs) + 1}"
                api.by_key[key] = job_id
                api.jobs.setdefault(job_id, {"polls": 0, "body": body})
                headers = {"Location": f"/v1/jobs/{job_id}", "Retry-After": api.retry_after}
                if replayed:
                    headers["Idempotent-Replayed"] = "true"
                self._json(202, api.job(job_id), **headers)

            def do_GET(self) -> None:
                if self.path == "/v1/info":
                    api.info_requests += 1
                    if api.info is None:
                        self._json(404, {"type": PROBLEM + "not-found", "title": "Not found"})
                    else:
                        self._json(200, api.info)
                    return
                api.requests.append(
                    {"method": "GET", "path": self.path, "headers": dict(self.headers)}
                )
                parts = self.path.strip("/").split("/")
                job_id = parts[2]
                if len(parts) == 4 and parts[3] == "report":
                    self._json(200, api.report)
                elif len(parts) == 4 and parts[3] == "model":
                    self._send(
                        200, b"fused-model-bytes", {"Content-Type": "application/octet-stream"}
                    )
                else:
                    api.jobs[job_id]["polls"] += 1
                    job = api.job(job_id)
                    etag = f'"{job["revision"]}"'
                    headers = {"ETag": etag, "Retry-After": api.retry_after}
                    if self.headers.get("If-None-Match") == etag:
                        api.not_modified += 1
                        self._send(304, b"", headers)
                    else:
                        self._json(200, job, **headers)

        return Handler


PLAN = Plan(CompiledSnapshot(1, [], []), {}, None)


@pytest.fixture
def fake(reports) -> Iterator[tuple[FakeApi, str]]:
    api = FakeApi(reports["plain"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), api.handler())
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield api, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_submit_waits_downloads_and_summarises(capsys, fake, model_file, tmp_path, monkeypatch):
    api, url = fake
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("AUTOFUSION_API_KEY", "af_secret")
    fused, report = tmp_path / "out" / "fused.onnx", tmp_path / "report.json"
    code, out, err = cli(
        capsys, "submit", model_file, "--server", url, "--wait", "-o", fused,
        "--report", report, "--max-abs-diff", "1e-3", "--target", "onnxruntime",
    )  # fmt: skip
    assert code == 0, err
    assert fused.read_bytes() == b"fused-model-bytes"
    assert json.loads(report.read_text()) == api.report
    post = api.requests[0]
    assert api.info_requests == 1  # before the upload, for the key
    assert post["headers"]["Idempotency-Key"] == idempotency_key(
        Upload(model_file, [], {"target": "onnxruntime"}), ServerFacts("9.9.9", 7)
    )
    assert post["headers"]["Authorization"] == "Bearer af_secret"
    assert b'name="model"; filename="m.onnx"' in post["body"]
    assert b'name="config"' in post["body"] and b'{"target": "onnxruntime"}' in post["body"]
    polls = [r for r in api.requests if r["method"] == "GET" and r["path"] == "/v1/jobs/job-1"]
    assert all(r["headers"].get("Authorization") == "Bearer af_secret" for r in polls)
    assert any("If-None-Match" in r["headers"] for r in polls)
    assert api.not_modified >= 1  # the repeated state came back as 304
    # A log (not a terminal): one line per status/stage change.
    assert "job job-1 running: optimize (30%)" in err
    assert "job job-1 running: validate (80%)" in err
    assert err.count("running: optimize") == 1
    facts = read_report(api.report)
    assert facts.fusions == 1 and line("fusions", "1 (conv_bn_relu 1)") in out
    assert f"passed, max abs diff {facts.max_abs_diff:.3g}" in out
    assert f"{facts.nodes_before} -> {facts.nodes_after}" in out
    assert line("speedup", "not measured: the job was not profiled (--profile") in out
    assert "gate max-abs-diff:" in out and "passed" in out
    assert line("job page", f"{url}/ui/jobs/job-1") in out
    assert line("report", f"{url}/v1/jobs/job-1/report") in out
    assert line("report page", f"{url}/ui/jobs/job-1/report.html") in out  # opens inline
    markdown = summary.read_text()
    assert markdown.startswith("earlier step\n### autofusion: `m.onnx` passed")
    assert "| fusions | 1 (conv_bn_relu 1) |" in markdown
    assert f"| report | {url}/v1/jobs/job-1/report |" in markdown
    assert "af_secret" not in out + err + markdown


LEADING = ["status", "exit_code", "message", "verdict", "speedup", "fusions", "check", "gate"]
LEADING += ["gates", "job_id", "reused", "urls", "details"]


def test_submit_json_leads_with_the_facts_and_is_short(capsys, fake, model_file):
    """Issue 27: the facts a CI script reads come first, in a few kB; the report and job
    resource (hundreds of kB for a real model) only with --json-full."""
    api, url = fake
    code, out, err = cli(capsys, "submit", model_file, "--server", url, "--wait", "--json")
    assert code == 0, err
    result, facts = json.loads(out), read_report(api.report)
    assert list(result) == LEADING and len(out) < 4096
    assert result["status"] == "succeeded" and result["exit_code"] == 0
    assert result["job_id"] == "job-1" and result["reused"] is None
    assert result["verdict"] is None and result["speedup"] is None  # not profiled
    assert result["fusions"] == facts.fusions == 1
    assert result["check"]["passed"] is True
    assert result["check"]["max_abs_diff"] == facts.max_abs_diff
    assert result["gate"] == "passed" and [g["name"] for g in result["gates"]] == ["check"]
    base = f"{url}/v1/jobs/job-1"
    assert result["urls"] == {
        "job": base,
        "page": f"{url}/ui/jobs/job-1",
        "report": f"{base}/report",
        "report_html": f"{base}/artifacts/report.html",
        "report_page": f"{url}/ui/jobs/job-1/report.html",
        "model": f"{base}/model",
    }
    details = result["details"]
    assert details["fusions_by_pattern"] == facts.counts and details["profiled"] is False
    assert details["nodes"] == {"before": facts.nodes_before, "after": facts.nodes_after}
    assert details["size_bytes"] == {
        "before": facts.size_before_bytes,
        "after": facts.size_after_bytes,
    }
    assert details["peak_memory_bytes"] == {
        "before": facts.peak_memory_before_bytes,
        "after": facts.peak_memory_after_bytes,
    }
    assert details["registry_version"] == 1 and details["speed"] is None

    code, out, err = cli(capsys, "submit", model_file, "--server", url, "--wait", "--json-full")
    full = json.loads(out)
    assert list(full) == [*LEADING, "report", "job"]
    assert full["report"] == api.report and full["job"]["id"] == "job-1"


def test_a_reused_job_is_said_to_be_one_and_a_registry_change_makes_a_new_job(
    capsys, fake, model_file
):
    """The retry of a step gets its job back, saying from when and with what; after a
    change of the server's registry (a pattern disabled) the same inputs make a new job."""
    api, url = fake
    submit = ("submit", model_file, "--server", url, "--wait")
    code, out, _ = cli(capsys, *submit)
    assert code == 0 and "reused" not in out
    code, out, _ = cli(capsys, *submit, "--json")
    again = json.loads(out)
    words = "reused job job-1 from 2026-12-06 07:00:00 UTC, same model, config and registry v7"
    assert again["job_id"] == "job-1" and len(api.jobs) == 1
    assert again["reused"]["message"] == words + ", server 9.9.9"
    assert again["reused"]["registry_version"] == 7
    assert again["reused"]["created_at"] == "2026-12-06T07:00:00Z"
    code, out, _ = cli(capsys, *submit)
    assert line("reused", words) in out

    api.info["registry_version"] = 8  # as after POST /v1/patterns/conv_bn_relu/disable
    code, out, _ = cli(capsys, *submit, "--json")
    assert json.loads(out)["job_id"] == "job-2" and json.loads(out)["reused"] is None
    assert len(api.jobs) == 2

    # A server without /v1/info: the key of the inputs alone; the job's snapshot is named.
    api.info = None
    cli(capsys, *submit)
    code, out, _ = cli(capsys, *submit, "--json")
    reused = json.loads(out)["reused"]
    assert code == 0 and len(api.jobs) == 3
    assert (
        reused["message"] == "reused job job-3 from 2026-12-06 07:00:00 UTC, same model, "
        "config and registry v1"
    )


def test_a_profiled_submit_shows_and_gates_on_the_speed(
    capsys, fake, reports, model_file, tmp_path, monkeypatch
):
    api, url = fake
    api.report = reports["profiled"]
    speed = read_report(api.report).speed
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    bar = speed.speedup * 0.5
    code, out, err = cli(
        capsys, "submit", model_file, "--server", url, "--wait", "--min-speedup", repr(bar),
        "--json",
    )  # fmt: skip
    assert code == 0, err
    # --min-speedup asks the server to profile: the config says so (and so the key).
    assert api.jobs["job-1"]["polls"] > 0
    assert api.config("job-1") == {"profile": True}
    result = json.loads(out)
    assert result["details"]["profiled"] is True
    assert result["details"]["speed"] == speed_dict(speed)
    assert result["verdict"] == speed.verdict
    assert result["speedup"]["runs"] == speed.runs
    assert result["speedup"]["value"] == pytest.approx(1 / speed.ratio)
    assert result["speedup"]["ratio_interval"] == [speed.low, speed.high]
    assert result["speedup"]["interval"] == pytest.approx([1 / speed.high, 1 / speed.low])
    assert result["speedup"]["words"] == speed.describe()
    assert result["gate"] == "passed"
    (gate,) = [g for g in result["gates"] if g["name"] == "min-speedup"]
    assert gate["passed"] and f"measured speedup {speed.speedup:.3f}x >=" in gate["message"]
    markdown = summary.read_text()
    # the measured verdict is this machine's: a slower one is called out in capitals
    flag = "SLOWER: " if speed.verdict == "slower" else ""
    assert f"| speedup | {flag}{speed.describe()} |" in markdown
    assert f"{url}/ui/jobs/job-1" in markdown and f"{url}/v1/jobs/job-1/report" in markdown

    # A bar above what was measured fails with 1, naming the speedup, verdict and runs.
    code, out, err = cli(
        capsys, "submit", model_file, "--server", url, "--wait", "--min-speedup",
        repr(speed.speedup * 2),
    )  # fmt: skip
    assert code == EXIT_GATE_FAILED
    assert f"measured speedup {speed.speedup:.3f}x <" in err
    assert f"{speed.runs} paired runs" in err and "interval" in err
    assert line("speedup", f"{flag}{speed.describe()}") in out
    assert len(api.jobs) == 1  # the same inputs and config: the same job


def test_profile_alone_is_sent_and_shown(capsys, fake, reports, model_file):
    api, url = fake
    api.report = reports["slower"]
    code, out, err = cli(capsys, "submit", model_file, "--server", url, "--wait", "--profile")
    assert code == 0, err  # no gate asked for: a slower result is shown, not gated
    assert api.config("job-1") == {"profile": True}
    speed = read_report(api.report).speed
    assert speed.verdict == "slower"
    assert line("speedup", f"SLOWER: {speed.describe()}") in out


def test_submit_without_wait_returns_when_queued(capsys, fake, model_file):
    api, url = fake
    code, out, _ = cli(capsys, "submit", model_file, "--server", url)
    assert code == 0
    assert out.strip() == f"autofusion: m.onnx -> job job-1 queued: {url}/v1/jobs/job-1"
    assert [r["method"] for r in api.requests] == ["POST"]


def test_failed_job_exits_4(capsys, fake, model_file, tmp_path, monkeypatch):
    api, url = fake
    api.states = [("running", "optimize", 0.2), ("failed", "failed", 0.2)]
    api.error = "the model is not valid ONNX"
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    fused = tmp_path / "x.onnx"
    code, out, err = cli(capsys, "submit", model_file, "--server", url, "--wait", "-o", fused)
    assert code == EXIT_JOB_FAILED
    assert "job job-1 failed: the model is not valid ONNX" in err
    assert not fused.exists()
    assert "FAILED" in summary.read_text()
    assert "--idempotency-key" not in err
    # A retried step gets the same failed job back, and is told how to run it again.
    code, _, err = cli(capsys, "submit", model_file, "--server", url, "--wait")
    assert code == EXIT_JOB_FAILED and len(api.jobs) == 1
    assert "pass a new --idempotency-key" in err
    code, _, err = cli(
        capsys, "submit", model_file, "--server", url, "--wait", "--idempotency-key", "again"
    )
    assert code == EXIT_JOB_FAILED and len(api.jobs) == 2


@pytest.mark.parametrize(
    "error, error_type, expected",
    [
        pytest.param("the model is not valid ONNX", "invalid-model", EXIT_BAD_INPUT, id="model"),
        pytest.param("no such pattern", "invalid-pattern", EXIT_BAD_INPUT, id="pattern"),
        pytest.param("outputs differ", "check-failed", EXIT_GATE_FAILED, id="check"),
        pytest.param("the worker died twice", "crashed-twice", EXIT_JOB_FAILED, id="crashed"),
        pytest.param(
            {"type": PROBLEM + "invalid-model", "title": "Invalid model", "detail": "not ONNX"},
            None,
            EXIT_BAD_INPUT,
            id="problem-object",
        ),
    ],
)
def test_a_failed_job_exits_as_its_cause_does_locally(
    capsys, fake, model_file, error, error_type, expected
):
    """The same mistake has the same code in every command: a server that found the
    model invalid exits 3, as optimize does; its check failing exits 1."""
    api, url = fake
    api.states = [("failed", "failed", 0.1)]
    api.error, api.error_type = error, error_type
    code, _, err = cli(capsys, "submit", model_file, "--server", url, "--wait")
    assert code == expected
    detail = error["detail"] if isinstance(error, dict) else error
    slug = (error["type"] if isinstance(error, dict) else PROBLEM + error_type).rpartition("/")[2]
    assert f"job job-1 failed ({slug}): {detail}" in err


def test_a_job_that_fell_back_passes_its_check_and_says_what_was_dropped(
    capsys, fake, reports, model_file, tmp_path
):
    api, url = fake
    api.report = reports["fell-back"]
    github = tmp_path / "github_output"
    code, out, err = cli(
        capsys, "submit", model_file, "--server", url, "--wait", "--github-output", github
    )
    assert code == EXIT_OK, err
    assert "passed, max abs diff" in out and "after falling back" in out
    assert "the fused model does not match the original" in out
    dropped = read_report(reports["fell-back"]).fallback_dropped
    assert f"{dropped} fusion(s) dropped" in out
    assert f"fallback-dropped={dropped}\n" in github.read_text()


@pytest.mark.parametrize(
    "options, report, message",
    [
        pytest.param(["--max-abs-diff", "1e-12"], "plain", "> 1e-12", id="max-abs-diff"),
        pytest.param(
            ["--min-speedup", "1.1"],
            "plain",
            "the job was profiled but its report has no speed",
            id="speed-missing",
        ),  # fmt: skip
        pytest.param(
            ["--min-speedup", "1"], "slower", "measured speedup 0.800x < 1x", id="speed-slower"
        ),
        pytest.param([], "mismatch", "does not match the original", id="check"),
    ],
)
def test_quality_gate_exits_1(
    capsys, fake, reports, model_file, tmp_path, options, report, message
):
    api, url = fake
    api.report = reports[report]
    fused = tmp_path / "fused.onnx"
    code, out, err = cli(
        capsys, "submit", model_file, "--server", url, "--wait", "-o", fused, *options
    )
    assert code == EXIT_GATE_FAILED
    assert "quality gate failed" in err and message in err
    assert "FAILED" in out
    assert fused.exists()  # the model is still written, for inspection


def test_timeout_exits_6(capsys, fake, model_file):
    api, url = fake
    api.states = [("running", "optimize", 0.1)]
    started = time.monotonic()
    code, _, err = cli(capsys, "submit", model_file, "--server", url, "--wait", "--timeout", "0.5")
    assert code == EXIT_TIMEOUT
    assert time.monotonic() - started < 10
    assert f"still running after 0.5 s; follow it at {url}/v1/jobs/job-1" in err


def test_retry_after_is_honoured(capsys, fake, model_file):
    api, url = fake
    api.states = [("queued", "queued", 0.0), ("succeeded", "succeeded", 1.0)]
    api.retry_after = "1"
    started = time.monotonic()
    code, _, _ = cli(capsys, "submit", model_file, "--server", url, "--wait")
    assert code == 0
    assert time.monotonic() - started >= 1.0


@pytest.mark.parametrize(
    "status, expected",
    [
        pytest.param(401, EXIT_USAGE, id="unauthorized"),
        pytest.param(422, EXIT_BAD_INPUT, id="invalid-model"),
        pytest.param(503, EXIT_SERVER, id="unavailable"),
    ],
)
def test_refused_upload(capsys, fake, model_file, status, expected):
    api, url = fake
    problem = {"type": "x", "title": "Unauthorized", "status": status, "detail": "no key"}
    api.post_answer = (status, problem)
    code, _, err = cli(capsys, "submit", model_file, "--server", url, "--wait")
    assert code == expected
    assert f"({status}): Unauthorized: no key" in err
    # 503 is retried (safe: the Idempotency-Key makes a repeat harmless); 401 is not.
    assert len(api.requests) == (3 if status == 503 else 1)


def test_not_an_autofusion_server_exits_5(capsys, fake, model_file):
    api, url = fake
    api.post_raw = b"<html>a login page</html>"
    code, out, err = cli(capsys, "submit", model_file, "--server", url)
    assert code == EXIT_SERVER
    assert "something other than a JSON object (text/html): is --server right?" in err


# ----- serve and keys, in-process ----------------------------------------------------------


def _serve_args(*argv: str):
    from autofusion.app.cli import build_parser

    return build_parser().parse_args(["serve", *argv])


@pytest.mark.parametrize(
    "host, options, allowed",
    [
        pytest.param("127.0.0.1", [], True, id="loopback"),
        pytest.param("localhost", [], True, id="localhost"),
        pytest.param("::1", [], True, id="ipv6-loopback"),
        pytest.param("0.0.0.0", [], False, id="any"),
        pytest.param("example.org", [], False, id="hostname"),
        pytest.param("0.0.0.0", ["--require-api-keys"], True, id="keys"),
        pytest.param("0.0.0.0", ["--insecure-no-auth"], True, id="insecure"),
    ],
)
def test_serve_refuses_open_host_without_keys(
    capsys, monkeypatch, tmp_path, host, options, allowed
):
    started = {}
    monkeypatch.setattr("uvicorn.run", lambda app, **kw: started.update(kw))
    code, _, err = cli(capsys, "serve", "--host", host, "--data-dir", tmp_path, *options)
    if allowed:
        assert code == 0 and started["host"] == host and started["port"] == 8000
    else:
        assert code == 2 and not started
        assert "--require-api-keys" in err and "--insecure-no-auth" in err


def test_serve_flags_override_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOFUSION_DATA_DIR", str(tmp_path / "env"))
    monkeypatch.setenv("AUTOFUSION_REQUIRE_API_KEYS", "true")
    settings = serve_cmd.settings_from_args(_serve_args())
    assert settings.data_dir == tmp_path / "env"
    assert settings.require_api_keys and settings.embedded_worker
    assert settings.is_embedded_broker
    settings = serve_cmd.settings_from_args(
        _serve_args("--data-dir", str(tmp_path / "flag"), "--broker", "redis://r:6379/0")
    )
    assert settings.data_dir == tmp_path / "flag"
    assert settings.resolved_broker_url == "redis://r:6379/0" and not settings.embedded_worker
    settings = serve_cmd.settings_from_args(
        _serve_args("--broker", "redis://r:6379/0", "--embedded-worker")
    )
    assert settings.embedded_worker
    monkeypatch.setenv("AUTOFUSION_EMBEDDED_WORKER", "true")
    settings = serve_cmd.settings_from_args(_serve_args("--broker", "redis://r:6379/0"))
    assert settings.embedded_worker
    settings = serve_cmd.settings_from_args(_serve_args("--no-embedded-worker"))
    assert not settings.embedded_worker


def test_serve_rejects_invalid_settings(capsys, monkeypatch):
    monkeypatch.setenv("AUTOFUSION_JOB_TIME_LIMIT_S", "7200")  # above the visibility timeout
    code, _, err = cli(capsys, "serve")
    assert code == 2
    assert "visibility_timeout_s" in err


def test_keys_create_list_revoke(capsys, tmp_path):
    data = tmp_path / "data"
    code, out, err = cli(
        capsys, "keys", "create", "--tenant", "ci", "--scopes", "jobs:write,patterns:write",
        "--name", "pipeline", "--data-dir", data,
    )  # fmt: skip
    assert code == 0, err
    token = out.strip()
    assert token.startswith("af_") and "\n" not in token
    assert "shown only now" in err and token not in err
    url = f"sqlite:///{(data / 'autofusion.db').resolve()}"
    with session_scope(url) as session:
        principal = authenticate(session, token)
    assert principal.tenant_id == "ci"
    assert principal.scopes == {"jobs:write", "patterns:write"}

    code, out, _ = cli(capsys, "keys", "list", "--data-dir", data, "--json")
    (row,) = json.loads(out)
    assert row["tenant"] == "ci" and row["name"] == "pipeline" and row["revoked_at"] is None
    assert token not in out and token[:11] == row["prefix"]
    code, out, _ = cli(capsys, "keys", "list", "--data-dir", data)
    assert "active" in out and "pipeline" in out

    assert cli(capsys, "keys", "revoke", str(row["id"]), "--data-dir", data)[0] == 0
    with session_scope(url) as session:
        assert authenticate(session, token) is None
    code, _, err = cli(capsys, "keys", "revoke", "99", "--data-dir", data)
    assert code == 2 and "no key 99" in err


@pytest.mark.parametrize(
    "options, message",
    [
        pytest.param(["--tenant", "ci", "--scopes", "jobs:rule"], "unknown scope", id="scope"),
        pytest.param(["--tenant", "a b", "--scopes", "admin"], "invalid tenant", id="tenant"),
        pytest.param(["--tenant", "ci", "--scopes", ","], "--scopes is empty", id="empty"),
    ],
)
def test_keys_create_rejects(capsys, tmp_path, options, message):
    code, out, err = cli(capsys, "keys", "create", *options, "--data-dir", tmp_path)
    assert code == 2 and message in err and out == ""


def test_migrate_creates_the_schema(tmp_path):
    import argparse

    from autofusion.app.cli import migrate as migrate_cmd

    # Parsed here so the test does not depend on the command's registration in app.cli.
    parser = argparse.ArgumentParser()
    migrate_cmd.add_parser(parser.add_subparsers())
    url = f"sqlite:///{(tmp_path / 'x.db').resolve()}"
    args = parser.parse_args(["migrate", "--database", url])
    assert args.run(args) == 0
    upgrade(url)  # already at head: a no-op
    from autofusion.app.migrate import check

    check(url)  # models and migrations agree on the migrated database


@pytest.mark.parametrize("exists", [True, False], ids=["bucket-exists", "bucket-missing"])
def test_migrate_creates_a_missing_bucket(monkeypatch, exists):
    import boto3
    from botocore.stub import Stubber

    from autofusion.app.cli.migrate import ensure_bucket
    from autofusion.app.core.config import Settings

    client = boto3.client(
        "s3",
        endpoint_url="http://minio:9000",
        region_name="us-east-1",
        aws_access_key_id="k",
        aws_secret_access_key="s",
    )
    stub = Stubber(client)
    if exists:
        stub.add_response("head_bucket", {}, {"Bucket": "af"})
    else:
        stub.add_client_error("head_bucket", "404", http_status_code=404)
        stub.add_response("create_bucket", {}, {"Bucket": "af"})
    monkeypatch.setattr(boto3, "client", lambda *a, **k: client)
    settings = Settings(artifact_store="s3", s3_bucket="af", s3_endpoint_url="http://minio:9000")
    with stub:
        assert ensure_bucket(settings) is (not exists)
        stub.assert_no_pending_responses()


# ----- end to end: a real `autofusion serve` (embedded mode) ------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("serve") / "data", env=FAST_POLL)
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()


def _submit_json(capsys, server: Server, *options: str | Path) -> tuple[int, dict, str]:
    code, out, err = cli(
        capsys, "submit", RESNET, "--server", server.url, "--wait", "--timeout", "120",
        "--json", *options,
    )  # fmt: skip
    return code, (json.loads(out) if out.strip() else {}), err


@pytest.mark.slow
def test_e2e_submit_fuses_and_gates(capsys, server, tmp_path):
    fused = tmp_path / "fused.onnx"
    code, first, err = _submit_json(capsys, server, "-o", fused, "--max-abs-diff", "1e-3")
    assert code == 0, err
    ops = {node.op_type for node in onnx.load(fused).graph.node}
    assert "BatchNormalization" not in ops and "Conv" in ops
    assert first["status"] == "succeeded" and first["check"]["passed"]
    assert first["fusions"] == sum(first["details"]["fusions_by_pattern"].values()) > 0
    assert first["details"]["nodes"]["after"] < first["details"]["nodes"]["before"]
    diff = first["check"]["max_abs_diff"]
    assert 0 <= diff <= 1e-3

    # The same inputs again (a retried CI step): the same job, nothing recomputed.
    code, again, err = _submit_json(capsys, server, "--max-abs-diff", repr(diff))
    assert code == 0, err  # the gate is inclusive: diff <= diff
    assert again["job_id"] == first["job_id"] and again["reused"]["job_id"] == first["job_id"]

    # A gate tighter than what the check measured fails with 1. When the fused model
    # matches exactly (diff 0), nothing is tighter than 0 and the strictest gate passes.
    code, strict, err = _submit_json(capsys, server, "--max-abs-diff", repr(diff / 2))
    assert strict["job_id"] == first["job_id"]
    if diff > 0:
        assert code == EXIT_GATE_FAILED and "max abs diff" in err
        assert strict["gates"][-1]["passed"] is False and strict["gate"] == "failed"
    else:
        assert code == 0 and strict["gates"][-1]["passed"] is True


@pytest.mark.slow
def test_e2e_a_disabled_pattern_makes_the_same_submit_a_new_job(capsys, server):
    """Issue 27: after a pattern was disabled on the server, submitting the same model
    again handed back the old job, still listing those fusions. The key now covers the
    registry: a new job, run without the pattern, on the next registry version."""
    code, first, err = _submit_json(capsys, server)
    assert code == 0, err
    counts = first["details"]["fusions_by_pattern"]
    fired = max(counts, key=counts.get)
    code, again, err = _submit_json(capsys, server)
    assert again["job_id"] == first["job_id"] and again["reused"], err  # nothing changed
    disabled = httpx.post(f"{server.url}/v1/patterns/{fired}/disable")
    assert disabled.status_code == 200, disabled.text
    try:
        code, after, err = _submit_json(capsys, server)
        assert code == 0, err
        assert after["job_id"] != first["job_id"] and after["reused"] is None
        assert fired not in after["details"]["fusions_by_pattern"]
        assert after["details"]["registry_version"] > first["details"]["registry_version"]
    finally:
        httpx.post(f"{server.url}/v1/patterns/{fired}/enable").raise_for_status()


@pytest.mark.slow
def test_e2e_speed_gate_on_a_real_profiled_job(capsys, server, tmp_path, monkeypatch):
    """The speed gate against a real server and a real profiled job: it passes below the
    measured speedup and fails above it, naming the speedup; the summaries show it."""
    model = write_model(tmp_path, "speedy.onnx", width=32)
    step_summary = tmp_path / "step-summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step_summary))
    base = ["submit", model, "--server", server.url, "--wait", "--timeout", "180"]
    code, out, err = cli(capsys, *base, "--profile", "--min-speedup", "0.01")
    assert code == 0, err
    job_id = out.split("job:", 1)[1].split()[0]
    job = httpx.get(f"{server.url}/v1/jobs/{job_id}").json()
    report = httpx.get(f"{server.url}/v1/jobs/{job_id}/report").json()
    speed = read_report(report).speed
    assert job["config"]["profile"] is True and speed is not None and speed.runs > 0
    # The job resource's summary carries the same speed (the worker read it the same way).
    assert job["summary"]["speed"] == pytest.approx(speed_dict(speed))
    page, report_url = f"{server.url}/ui/jobs/{job_id}", f"{server.url}/v1/jobs/{job_id}/report"
    assert line("speedup", f"{speed.describe()}") in out
    assert speed.verdict in out and f"{speed.speedup:.2f}x" in out
    assert line("job page", f"{page}") in out and line("report", f"{report_url}") in out
    assert f"passed: measured speedup {speed.speedup:.3f}x >= 0.01x" in out
    markdown = step_summary.read_text()
    assert "### autofusion: `speedy.onnx` passed" in markdown
    assert f"| speedup | {speed.describe()} |" in markdown
    assert f"| job page | {page} |" in markdown and f"| report | {report_url} |" in markdown
    assert "| gate min-speedup | passed: measured speedup" in markdown
    assert httpx.get(page).status_code == 200  # the URLs shown are real

    # The same inputs and config (the bar is not part of them): the same job, gated higher.
    code, out, err = cli(capsys, *base, "--min-speedup", "1000")
    assert code == EXIT_GATE_FAILED
    assert line("job", f"{job_id} succeeded") in out
    assert f"measured speedup {speed.speedup:.3f}x < 1000x" in err
    assert f"{speed.runs} paired runs" in err
    assert "FAILED: measured speedup" in step_summary.read_text().split("### autofusion")[-1]


@pytest.mark.slow
def test_e2e_api_keys(capsys, tmp_path):
    data = tmp_path / "data"
    code, out, err = cli(
        capsys, "keys", "create", "--tenant", "ci", "--scopes", "jobs:write", "--data-dir", data
    )
    assert code == 0, err
    token = out.strip()
    srv = Server(data, "--require-api-keys", env=FAST_POLL)
    try:
        srv.wait_healthy()
        code, _, err = cli(capsys, "submit", RESNET, "--server", srv.url)
        assert code == 2 and "401" in err
        code, _, err = cli(capsys, "submit", RESNET, "--server", srv.url, "--api-key", "af_wrong")
        assert code == 2 and "401" in err
        code, result, err = _submit_json(capsys, srv, "--api-key", token)
        assert code == 0, err
        assert result["status"] == "succeeded"
    finally:
        srv.stop()


@pytest.fixture
def external_data_model(tmp_path) -> tuple[Path, Path]:
    """The ResNet test model with every weight in one external-data file beside it."""
    path = tmp_path / "resnet.onnx"
    onnx.save_model(
        onnx.load(RESNET),
        path,
        save_as_external_data=True,
        location="resnet.weights",
        size_threshold=0,
    )
    weights = tmp_path / "resnet.weights"
    assert weights.stat().st_size > path.stat().st_size
    return path, weights


@pytest.mark.slow
def test_e2e_external_data(capsys, server, external_data_model, tmp_path):
    path, weights = external_data_model
    fused = tmp_path / "fused.onnx"
    code, out, err = cli(
        capsys, "submit", path, "--data", weights, "--server", server.url, "--wait",
        "--timeout", "120", "-o", fused, "--json-full",
    )  # fmt: skip
    result = json.loads(out)
    assert [d["name"] for d in result["job"]["data_files"]] == ["resnet.weights"]
    assert code == 0, err
    assert "BatchNormalization" not in {n.op_type for n in onnx.load(fused).graph.node}


@pytest.mark.slow
def test_e2e_external_data_file_missing(capsys, server, external_data_model):
    path, _ = external_data_model
    # Without its data file the server refuses the model: bad input, with the reason.
    code, out, err = cli(capsys, "submit", path, "--server", server.url)
    assert code == EXIT_BAD_INPUT and "(422)" in err and "resnet.weights" in err
    assert out == ""


# ----- the compose topology, minus containers: migrate once, API, separate worker ----------


@pytest.mark.slow
def test_e2e_distributed(capsys, tmp_path, postgres_url, redis_url):
    """As docker-compose.yml runs it: migrate once; an API with migrations off, no worker
    thread (a Redis broker turns it off) and keys required; jobs wait for a worker."""
    from autofusion.app.cli import migrate as migrate_cmd

    env = {"AUTOFUSION_DATABASE_URL": postgres_url, "AUTOFUSION_BROKER_URL": redis_url}
    migrate_cmd.prepare_database(migrate_cmd.Settings(database_url=postgres_url))
    code, out, err = cli(capsys, "keys", "create", "--tenant", "ci", "--database", postgres_url)
    assert code == 0, err
    key = out.strip()
    api_env = {**env, **FAST_POLL, "AUTOFUSION_MIGRATE_ON_START": "false"}
    srv = Server(tmp_path / "api", "--require-api-keys", env=api_env)
    worker = None
    try:
        srv.wait_healthy()
        code, out, err = cli(capsys, "submit", RESNET, "--server", srv.url, "--api-key", key)
        assert code == 0, err
        time.sleep(3)  # no worker yet: the job must still be queued
        job = httpx.get(out.split(": ")[-1].strip(), headers={"X-API-Key": key}).json()
        assert job["status"] == "queued"

        # Local artifacts: the worker shares the API's data dir (compose shares S3 instead).
        worker_env = {**env, "AUTOFUSION_DATA_DIR": str(tmp_path / "api")}
        worker = start_cli(["worker", "--pool", "solo"], tmp_path / "worker.log", worker_env)
        code, result, err = _submit_json(capsys, srv, "--api-key", key)
        assert code == 0, err + (tmp_path / "worker.log").read_text()[-3000:]
        assert result["job_id"] == job["id"]
        assert result["check"]["passed"]
        # The downloaded fused model runs in onnxruntime and matches the original.
        model_url = f"{srv.url}/v1/jobs/{job['id']}/model"
        fused = onnx.load_from_string(httpx.get(model_url, headers={"X-API-Key": key}).content)
        assert "BatchNormalization" not in {n.op_type for n in fused.graph.node}
        x = np.random.default_rng(1).standard_normal((1, 3, 32, 32)).astype(np.float32)
        want = make_session(onnx.load(RESNET)).run(None, {"input": x})[0]
        got = make_session(fused).run(None, {"input": x})[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-4)
    finally:
        if worker is not None:
            stop_process(worker)
        srv.stop()


def test_a_failed_check_job_still_writes_its_report(capsys, fake, reports, model_file, tmp_path):
    """A job whose check failed keeps the report saying what the check saw."""
    api, url = fake
    api.states = [("running", "optimize", 0.2), ("failed", "failed", 0.9)]
    api.error = "the fused model does not match the original; see the report"
    api.error_type = "check-failed"
    api.report = reports["mismatch"]
    report_path = tmp_path / "r.json"
    code, _, err = cli(
        capsys, "submit", model_file, "--server", url, "--wait", "--report", report_path
    )
    assert code == EXIT_GATE_FAILED and "does not match the original" in err
    assert json.loads(report_path.read_text()) == api.report
