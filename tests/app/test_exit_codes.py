"""The one table of exit codes (app/cli/_exit.py): every code it lists is what a command
returns in that situation, and docs/service.md and the README list the same table.

The server side is a small stub speaking the API's shapes (a queued job, a cancelled
one, a 412 on a registry change), so each situation is exact; tests/app/test_cli_jobs.py,
test_cli_registry.py and test_submit.py check the same codes against a real server.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from cli_server import free_port

import autofusion.app.cli.optimize as optimize_cmd
from autofusion.app.cli import main
from autofusion.app.cli._exit import (
    EXIT_BAD_INPUT,
    EXIT_CONFLICT,
    EXIT_GATE_FAILED,
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_JOB_FAILED,
    EXIT_OK,
    EXIT_QUOTA,
    EXIT_SERVER,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    TABLE,
)
from autofusion.fusion_core.testing import conv_bn_relu

REPO = Path(__file__).resolve().parents[2]
RESNET = REPO / "tests" / "data" / "resnet" / "resnet50_w8_torchscript.onnx"


def _job(job_id: str) -> dict:
    status = {"queued": "queued", "cancelled": "cancelled"}[job_id]
    return {"id": job_id, "status": status, "stage": status, "progress": 0.0, "links": {}}


class _Stub(BaseHTTPRequestHandler):
    """GET /v1/jobs/{queued,cancelled}; PUT /v1/patterns/* answers 412; POST /v1/optimize
    answers 429 too-many-queued-jobs (the tenant's quota)."""

    def log_message(self, *args) -> None:  # quiet
        pass

    def _send(self, status: int, body: dict, media: str = "application/json") -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", media)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        job_id = self.path.rsplit("/", 1)[1]
        if self.path.startswith("/v1/jobs/") and job_id in ("queued", "cancelled"):
            self._send(200, _job(job_id))
        else:
            self._send(404, {"title": "Not Found", "status": 404}, "application/problem+json")

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        problem = {
            "type": "https://autofusion.dev/problems/too-many-queued-jobs",
            "title": "Too many queued jobs",
            "status": 429,
            "detail": "this tenant has 20 jobs queued, its limit",
        }
        self._send(429, problem, "application/problem+json")

    def do_PUT(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        problem = {"title": "Precondition Failed", "status": 412, "detail": "stale ETag"}
        self._send(412, problem, "application/problem+json")


@pytest.fixture(scope="module")
def stub() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), _Stub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture(autouse=True)
def _isolated(monkeypatch, tmp_path):
    monkeypatch.delenv("AUTOFUSION_SERVER", raising=False)
    monkeypatch.delenv("GITHUB_OUTPUT", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))


def run(*args: str | Path) -> int:
    try:
        return main([str(a) for a in args])
    except SystemExit as exc:  # argparse's own usage errors
        return exc.code


def _model(tmp_path: Path) -> Path:
    import onnx

    path = tmp_path / "net.onnx"
    onnx.save_model(conv_bn_relu(width=8), path)
    return path


def _raising(error: BaseException) -> Callable:
    def broken(*args, **kwargs):
        raise error

    return broken


# Each situation: (why, the command line as a function of tmp_path and the stub's URL).
SITUATIONS: dict[int, list[tuple[str, Callable[[Path, str], tuple]]]] = {
    EXIT_OK: [("optimize fuses and checks", lambda t, s: ("optimize", _model(t), "-o", t / "f"))],
    EXIT_GATE_FAILED: [
        (
            "optimize --strict: zero tolerance sees the folded BN's last bits",
            lambda t, s: (
                "optimize",
                RESNET,
                "-o",
                t / "f",
                "--rtol",
                "0",
                "--atol",
                "0",
                "--strict",
            ),
        )
    ],
    EXIT_USAGE: [
        ("an unknown option", lambda t, s: ("optimize", "--no-such-option")),
        (
            "an unknown pattern",
            lambda t, s: ("optimize", _model(t), "-o", t / "f", "--patterns", "nope"),
        ),
        ("submit without --server", lambda t, s: ("submit", _model(t))),
        ("a job that does not exist", lambda t, s: ("jobs", "status", "nope", "--server", s)),
    ],
    EXIT_BAD_INPUT: [
        ("optimize: not ONNX", lambda t, s: ("optimize", _text(t), "-o", t / "f")),
        ("submit: no such model", lambda t, s: ("submit", t / "none.onnx", "--server", s)),
    ],
    EXIT_JOB_FAILED: [
        ("a cancelled job", lambda t, s: ("jobs", "wait", "cancelled", "--server", s))
    ],
    EXIT_SERVER: [
        ("nothing listens", lambda t, s: ("jobs", "status", "x", "--server", "http://127.0.0.1:9")),
    ],
    EXIT_TIMEOUT: [
        (
            "the job stays queued",
            lambda t, s: ("jobs", "wait", "queued", "--timeout", "0.3", "--server", s),
        )
    ],
    EXIT_QUOTA: [("the tenant's queued jobs", lambda t, s: ("submit", _model(t), "--server", s))],
    EXIT_CONFLICT: [
        (
            "someone changed it in between (412)",
            lambda t, s: (
                "registry",
                "patterns",
                "put",
                "p",
                _pattern(t),
                "--if-match",
                '"p@1"',
                "--server",
                s,
            ),
        )
    ],
}


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "notes.onnx"
    path.write_text("not a model")
    return path


def _pattern(tmp_path: Path) -> Path:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\nnodes: [{id: r, op: Relu}]\nrewriter: {name: fused_region}\n")
    return path


CASES = [
    pytest.param(code, argv, id=f"{code}-{why}")
    for code, situations in SITUATIONS.items()
    for why, argv in situations
]


@pytest.mark.parametrize("code, argv", CASES)
def test_each_code_is_what_the_command_returns(code, argv, tmp_path, stub):
    assert run(*argv(tmp_path, stub)) == code


@pytest.mark.parametrize(
    "error, code",
    [
        pytest.param(RuntimeError("a bug"), EXIT_INTERNAL, id="internal"),
        pytest.param(KeyboardInterrupt(), EXIT_INTERRUPTED, id="interrupted"),
    ],
)
def test_a_bug_and_ctrl_c(error, code, tmp_path, monkeypatch):
    monkeypatch.setattr(optimize_cmd, "run_files", _raising(error))
    assert run("optimize", _model(tmp_path), "-o", tmp_path / "f") == code


def test_every_code_of_the_table_has_a_situation_here():
    tested = set(SITUATIONS) | {EXIT_INTERNAL, EXIT_INTERRUPTED}
    assert {code for code, _, _ in TABLE} == tested


def _documented(text: str) -> dict[int, str]:
    """``| code | name | meaning |`` rows of the exit-code table in a Markdown file."""
    rows = re.findall(r"^\| `?(\d+)`? \| `([a-z-]+)` \|", text, flags=re.MULTILINE)
    return {int(code): name for code, name in rows}


@pytest.mark.parametrize("doc", ["docs/service.md", "README.md"])
def test_the_documents_list_the_table(doc):
    documented = _documented((REPO / doc).read_text(encoding="utf-8"))
    assert documented == {code: name for code, name, _ in TABLE}
