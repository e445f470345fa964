"""The sandbox cannot reach out (issue 26, item 4): each test starts a real sandbox as
the service starts it, and a probe inside tries what a hostile model's code would.

On a service running as root, sandboxes run as ``nobody``: these tests need root and an
interpreter ``nobody`` can run (.ci/run makes it so); elsewhere they skip, saying why.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import tempfile
from pathlib import Path

import pytest

from autofusion.app.core.config import Settings
from autofusion.app.services.sandbox import run_sandbox
from autofusion.app.services.sandbox_policy import (
    isolation_request,
    prepare_data_dir,
    sandbox_identity,
)
from tests.sandbox_probe import PROBE


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False)
    identity = sandbox_identity(settings)
    if identity is None:
        pytest.skip(
            "sandboxes run as the service's own user here (not root, or nobody cannot run "
            "this Python: see the start's warning)"
        )
    # What a tenant's neighbours leave in the data directory.
    (settings.artifacts_dir / "ab").mkdir(parents=True)
    (settings.artifacts_dir / "ab" / "secret-model").write_bytes(b"another tenant's model")
    (settings.data_dir / "autofusion.db").write_bytes(b"SQLite format 3\0")
    prepare_data_dir(settings, "worker")
    return settings


def probe(settings: Settings, targets: dict, folder: bool = False, **limits):
    folder_too, folder = folder, Path(tempfile.mkdtemp(dir=settings.jobs_dir))
    request = {
        "targets": targets,
        "memory_limit_mb": 2048,
        "parent_pid": os.getpid(),
        **isolation_request(settings, file_size_limit_mb=limits.pop("file_size_limit_mb", 64)),
        **limits,
    }
    (folder / PROBE.request_file).write_text(json.dumps(request), encoding="utf-8")
    run = run_sandbox(PROBE, folder, time_limit_s=60, identity=sandbox_identity(settings))
    assert run.failure is None, (run, run.log_tail)
    found = json.loads((folder / PROBE.result_file).read_text(encoding="utf-8"))
    return (found, folder) if folder_too else found


def test_the_sandbox_runs_as_its_own_user_and_writes_only_its_folder(settings: Settings) -> None:
    found = probe(settings, {})
    identity = sandbox_identity(settings)
    assert (found["uid"], found["gid"], found["groups"]) == (identity.uid, identity.gid, [])
    assert found["uid"] != os.getuid()
    assert found["own_folder"] == "ok"


def test_a_link_the_sandbox_leaves_is_removed_before_its_parent_reads(
    settings: Settings,
) -> None:
    """A subverted sandbox's ``report.json -> the database`` would have the worker store a
    file only the service can read, for the tenant to download."""
    database = settings.data_dir / "autofusion.db"
    found, folder = probe(settings, {"link": {"report.json": str(database)}}, folder=True)
    assert found["link"] == {"report.json": "ok"}
    assert not os.path.lexists(folder / "report.json")
    assert database.read_bytes() == b"SQLite format 3\0"  # the target itself untouched


def test_the_sandbox_cannot_read_the_parents_environment(settings: Settings) -> None:
    found = probe(settings, {"environ": f"/proc/{os.getpid()}/environ"})
    assert found["environ"] == f"errno:{errno.EACCES}"


def test_the_sandbox_sees_nothing_else_of_the_data_directory(settings: Settings) -> None:
    data = settings.data_dir
    targets = {
        "list": [str(data), str(settings.jobs_dir), str(settings.artifacts_dir)],
        "read": [str(data / "autofusion.db"), str(settings.artifacts_dir / "ab" / "secret-model")],
    }
    found = probe(settings, targets)
    denied = f"errno:{errno.EACCES}"
    assert set(found["list"].values()) == {denied}, found["list"]
    assert set(found["read"].values()) == {denied}, found["read"]


def _listening() -> socket.socket:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    return server


def test_the_sandbox_has_no_network(settings: Settings) -> None:
    # A port that certainly listens on this machine's loopback (as PostgreSQL and Redis do).
    with _listening() as server:
        port = server.getsockname()[1]
        found = probe(settings, {"connect": [["127.0.0.1", port]]})
        shared = probe(settings, {"connect": [["127.0.0.1", port]]}, isolate_network=False)
    assert found["connect"][f"127.0.0.1:{port}"] != "ok"
    # The same probe with the network left shared connects: the refusal is the namespace.
    assert shared["connect"][f"127.0.0.1:{port}"] == "ok"


def test_a_file_past_the_size_limit_fails_the_write_not_the_sandbox(settings: Settings) -> None:
    found = probe(settings, {"write_mb": 8}, file_size_limit_mb=4)
    assert found["write"] == f"errno:{errno.EFBIG}"
    assert probe(settings, {"write_mb": 3}, file_size_limit_mb=4)["write"] == "ok"


def test_a_fork_bomb_stops_at_the_process_limit(settings: Settings) -> None:
    found = probe(settings, {"fork": 200}, process_limit=32)
    assert found["fork"] == f"errno:{errno.EAGAIN}"


def test_the_cpu_limit_kills_a_sandbox_that_spins(settings: Settings) -> None:
    folder = settings.jobs_dir / "job-2"
    folder.mkdir(parents=True)
    request = {
        "targets": {"spin_s": 30},
        "memory_limit_mb": 2048,
        "cpu_limit_s": 1,
        "parent_pid": os.getpid(),
        **isolation_request(settings, file_size_limit_mb=64),
    }
    (folder / PROBE.request_file).write_text(json.dumps(request), encoding="utf-8")
    run = run_sandbox(PROBE, folder, time_limit_s=60, identity=sandbox_identity(settings))
    assert run.returncode in (-signal.SIGXCPU, -signal.SIGKILL)
    assert run.seconds < 20
    assert run.cpu_seconds >= 0.9  # it was computing: wait4's usage reaches the parent
