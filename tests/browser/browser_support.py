"""What the browser tests and ``screenshots.py`` share: the real server and the browser.

``running_server(data_dir)`` starts ``autofusion serve`` in embedded mode (SQLite, the
in-process worker thread, local artifacts) in a subprocess on a free port of 127.0.0.1
and always stops it. ``launch_chromium(playwright)`` starts Debian's chromium
(``/usr/bin/chromium``, never a downloaded browser) headless. ``RequestGuard`` lets a
browser context talk to 127.0.0.1 only and records everything else it tried.

Loaded by path (``tests/`` is not a package), as ``tests/worker/worker_testing.py`` is.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn
from urllib.parse import urlsplit

import httpx
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_ENV = "AUTOFUSION_REQUIRE_BROWSER"
INSTALL_HINT = (
    "install Debian's chromium (apt-get install -y chromium; .ci/run does this) and the "
    "test extra (pip install -e '.[test]', which brings playwright); never run "
    "`playwright install`"
)
# Headless, as root in a container, without a GPU or a big /dev/shm; and no traffic of
# the browser's own (updates, sync, metrics) that would try to leave the machine.
CHROMIUM_ARGS = [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-extensions",
    "--disable-sync",
    "--no-first-run",
    "--no-pings",
]
VIEWPORT = {"width": 1280, "height": 900}
# Generous but bounded: one page action, and a whole job of a tiny model.
ACTION_TIMEOUT_MS = 15_000
JOB_TIMEOUT_MS = 90_000
# The sandbox's test hook (worker/sandbox.py): each job sleeps this long before it
# optimizes, so the browser sees it queued/running before it ends.
SANDBOX_HOOK_ENV = "AUTOFUSION_SANDBOX_TEST_CRASH"
LOOPBACK = "127.0.0.1"


def browser_missing() -> str | None:
    """Why the browser tests cannot run here, or None."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return f"playwright is not installed: {INSTALL_HINT}"
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no browser at {CHROMIUM}: {INSTALL_HINT}"
    return None


def browser_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def unavailable(reason: str) -> NoReturn:
    """Skip the calling test, or fail it where the browser is required (CI)."""
    import pytest

    if browser_required():
        pytest.fail(f"{REQUIRE_ENV} is set but the browser tests cannot run: {reason}")
    pytest.skip(reason)


def launch_chromium(playwright):
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


@dataclass
class Server:
    url: str
    data_dir: Path
    log: Path
    process: subprocess.Popen

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


def _server_env(job_delay_s: float) -> dict[str, str]:
    # Nothing of the caller's AUTOFUSION_* settings (a PostgreSQL URL, a Redis broker,
    # API keys): this is embedded mode in its own data folder.
    env = {k: v for k, v in os.environ.items() if not k.upper().startswith("AUTOFUSION_")}
    if job_delay_s > 0:
        env[SANDBOX_HOOK_ENV] = f"sleep:{job_delay_s}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@contextmanager
def running_server(
    data_dir: Path,
    *,
    job_delay_s: float = 0.0,
    start_timeout_s: float = 60.0,
    log_level: str = "warning",
) -> Iterator[Server]:
    """``autofusion serve`` on a free port of 127.0.0.1, embedded mode, stopped after;
    its log (JSON lines: not a terminal) in ``data_dir/server.log``."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log = data_dir / "server.log"
    command = [
        sys.executable,
        "-c",
        "import sys; from autofusion.app.cli import main; sys.exit(main(sys.argv[1:]))",
        "serve",
        "--host",
        LOOPBACK,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--log-level",
        log_level,
    ]
    with open(log, "wb") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=_server_env(job_delay_s),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the sandboxes go with it
        )
    server = Server(f"http://{LOOPBACK}:{port}", data_dir, log, process)
    try:
        _wait_healthy(server, start_timeout_s)
        yield server
    finally:
        _stop(process)


def _wait_healthy(server: Server, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=2.0) as client:
        while time.monotonic() < deadline:
            if server.process.poll() is not None:
                raise RuntimeError(
                    f"autofusion serve exited with {server.process.returncode}:\n"
                    + server.log_tail()
                )
            try:
                if client.get(server.url + "/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
    raise RuntimeError(
        f"autofusion serve did not answer /healthz in {timeout_s:.0f} s:\n" + server.log_tail()
    )


def _stop(process: subprocess.Popen) -> None:
    """SIGTERM (uvicorn stops the worker thread and exits), then SIGKILL the group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=20)
    with suppress(ProcessLookupError):  # the group we created, if anything is left in it
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=10)


@dataclass
class RequestGuard:
    """Routes of a browser context: 127.0.0.1 passes, any other host is aborted."""

    seen: list[str] = field(default_factory=list)
    foreign: list[str] = field(default_factory=list)

    def install(self, context) -> None:
        context.route("**/*", self._route)
        context.route_web_socket("**/*", self._web_socket)

    @staticmethod
    def allowed(url: str) -> bool:
        parts = urlsplit(url)
        if parts.scheme in ("data", "blob", "about"):
            return True
        return parts.hostname == LOOPBACK

    def _route(self, route) -> None:
        url = route.request.url
        self.seen.append(url)
        if self.allowed(url):
            route.continue_()
        else:
            self.foreign.append(url)
            route.abort("blockedbyclient")

    def _web_socket(self, ws) -> None:
        self.seen.append(ws.url)
        if self.allowed(ws.url):
            ws.connect_to_server()
        else:
            self.foreign.append(ws.url)
            ws.close()


PAYLOAD = "<img src=x onerror=alert(1)>"


def conv_bn_relu_model(
    *,
    channels: int = 8,
    size: int = 16,
    doc_string: str = "",
    node_prefix: str = "",
    seed: int = 0,
) -> onnx.ModelProto:
    """Conv -> BatchNormalization -> Relu with constant weights: the builtin
    ``conv_bn_relu`` pattern fuses it (3 nodes -> 2 on the generic target)."""
    rng = np.random.default_rng(seed)
    c = channels
    initializers = [
        numpy_helper.from_array(rng.standard_normal((c, 3, 3, 3)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b"),
        numpy_helper.from_array((rng.random(c) + 0.5).astype(np.float32), "gamma"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "beta"),
        numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "mean"),
        numpy_helper.from_array((rng.random(c) + 0.5).astype(np.float32), "var"),
    ]
    nodes = [
        helper.make_node(
            "Conv", ["x", "w", "b"], ["c"], name=f"{node_prefix}conv", pads=[1, 1, 1, 1]
        ),
        helper.make_node(
            "BatchNormalization",
            ["c", "gamma", "beta", "mean", "var"],
            ["n"],
            name=f"{node_prefix}bn",
        ),
        helper.make_node("Relu", ["n"], ["y"], name=f"{node_prefix}relu"),
    ]
    for node in nodes:
        node.doc_string = doc_string
    graph = helper.make_graph(
        nodes,
        "conv_bn_relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, c, size, size])],
        initializers,
        doc_string=doc_string,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.doc_string = doc_string
    onnx.checker.check_model(model, full_check=True)
    return model


def builtin_pattern_yaml(name: str) -> str:
    return (ROOT / "fusion_core" / "patterns" / "builtin" / f"{name}.yaml").read_text(
        encoding="utf-8"
    )


def renamed_pattern_yaml(builtin: str, new_name: str, priority: int) -> str:
    """A builtin pattern's YAML under another name with another priority."""
    import yaml

    spec = yaml.safe_load(builtin_pattern_yaml(builtin))
    spec["name"] = new_name
    spec["priority"] = priority
    spec["description"] = f"A copy of {builtin} registered from the dashboard."
    return yaml.safe_dump(spec, sort_keys=False)


def chromium_available_for_scripts() -> None:
    """For scripts: exit with the install hint when the browser cannot run."""
    reason = browser_missing()
    if reason:
        sys.stderr.write(reason + "\n")
        raise SystemExit(2)


__all__ = [
    "ACTION_TIMEOUT_MS",
    "JOB_TIMEOUT_MS",
    "CHROMIUM",
    "CHROMIUM_ARGS",
    "INSTALL_HINT",
    "PAYLOAD",
    "REQUIRE_ENV",
    "VIEWPORT",
    "RequestGuard",
    "Server",
    "browser_missing",
    "browser_required",
    "builtin_pattern_yaml",
    "chromium_available_for_scripts",
    "conv_bn_relu_model",
    "free_port",
    "launch_chromium",
    "renamed_pattern_yaml",
    "running_server",
    "unavailable",
]
