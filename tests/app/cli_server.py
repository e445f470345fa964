"""A real ``autofusion serve`` in a subprocess, for the tests of the client commands
(submit, jobs, registry) against a live server, and the CLI run as a user runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_cli(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``autofusion ARGS`` in a subprocess, with only the AUTOFUSION_* variables given."""
    clean = {k: v for k, v in os.environ.items() if not k.upper().startswith("AUTOFUSION_")}
    command = [
        sys.executable,
        "-c",
        "import sys; from autofusion.app.cli import main; sys.exit(main())",
    ]
    with open(log, "wb") as out:
        return subprocess.Popen(
            command + args,
            cwd=REPO,
            env={**clean, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def stop_process(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


FAST_POLL = {"AUTOFUSION_RETRY_AFTER_S": "1"}


@pytest.fixture(autouse=True)
def clean_client_env(monkeypatch):
    """The client commands as a user runs them: no AUTOFUSION_* setting (a server, a key)
    and no GitHub step variables from the environment the tests run in. Autouse in each
    test module that imports it."""
    for name in list(os.environ):
        if name.upper().startswith("AUTOFUSION_") or name.startswith("GITHUB_"):
            monkeypatch.delenv(name)  # the Retry-After clients get: poll each second


class Server:
    def __init__(self, data_dir: Path, *options: str, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = data_dir.parent / f"serve-{self.port}.log"
        args = ["serve", "--port", str(self.port), "--data-dir", str(data_dir), *options]
        self.process = start_cli(args, self.log, env)

    def wait_healthy(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.fail(f"exited with {self.process.returncode}")
            try:
                status = httpx.get(f"{self.url}/healthz", timeout=2).status_code
            except httpx.TransportError:
                time.sleep(0.2)
                continue
            if status == 200:
                return
            self.fail(f"GET /healthz answered {status}")
        self.fail(f"/healthz not up after {timeout} s")

    def fail(self, why: str) -> None:
        self.stop()
        pytest.fail(f"autofusion serve {why}; its log:\n{self.log.read_text()[-4000:]}")

    def stop(self) -> None:
        stop_process(self.process)


def run_cli(capsys, *args: str | Path) -> tuple[int, str, str]:
    """``autofusion ARGS`` in this process: (exit code, stdout, stderr)."""
    from autofusion.app.cli import main

    try:
        code = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's usage errors
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def started_server(tmp_path_factory, name: str, *options: str):
    """A live ``autofusion serve`` for a module's fixture (``yield from``), stopped after."""
    srv = Server(tmp_path_factory.mktemp(name) / "data", *options, env=FAST_POLL)
    try:
        srv.wait_healthy()
        yield srv
    finally:
        srv.stop()
