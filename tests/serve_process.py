"""``autofusion serve`` as a real process on a free port of 127.0.0.1, and a job through
it over HTTP: for the tests that need the process as an operator starts it (the
installed wheel in ``tests/test_wheel.py``, the S3 store in ``tests/app/test_s3_store.py``).

Imported as ``tests.serve_process`` (pyproject.toml's ``pythonpath`` puts the repository
root on sys.path).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx

LOOPBACK = "127.0.0.1"
FINAL = ("succeeded", "failed", "cancelled")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


def log_tail(log: Path, size: int = 4000) -> str:
    try:
        return log.read_text(encoding="utf-8", errors="replace")[-size:]
    except OSError:
        return ""


@contextmanager
def serving(
    command: Sequence[str | os.PathLike],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log: Path,
    timeout_s: float = 60.0,
) -> Iterator[str]:
    """Start ``command`` (an ``autofusion serve ...`` line, ``--port`` included), wait for
    ``/healthz`` and yield the base URL; stop it (its process group) afterwards. The port
    is read from the command's ``--port``."""
    args = [str(part) for part in command]
    url = f"http://{LOOPBACK}:{args[args.index('--port') + 1]}"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            args,
            cwd=cwd,
            env=dict(env),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own group: the job sandboxes go with it
        )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if process.poll() is not None:
                raise AssertionError(f"serve exited with {process.returncode}:\n{log_tail(log)}")
            with suppress(httpx.TransportError):
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            if time.monotonic() > deadline:
                raise AssertionError(f"no /healthz after {timeout_s:g} s:\n{log_tail(log)}")
            time.sleep(0.2)
        yield url
    finally:
        if process.poll() is None:
            process.terminate()
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=20)
        with suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)


def run_job(client: httpx.Client, model: bytes, *, log: Path, timeout_s: float = 90.0) -> dict:
    """``POST /v1/optimize`` the model, poll the job until it is final and return it."""
    response = client.post(
        "/v1/optimize", files={"model": ("model.onnx", model, "application/octet-stream")}
    )
    assert response.status_code == 202, response.text
    job_url = response.headers["location"]
    deadline = time.monotonic() + timeout_s
    while (job := client.get(job_url).json())["status"] not in FINAL:
        assert time.monotonic() < deadline, (job, log_tail(log))
        time.sleep(0.3)
    assert job["status"] == "succeeded", (job, log_tail(log))
    return job
