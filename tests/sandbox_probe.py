"""A sandbox kind for tests only: ``python -P -m tests.sandbox_probe FOLDER`` tries, as
a hostile model's code would, to reach out of its sandbox, and writes what it managed.

``request.json`` names ``targets``: ``{"environ": path, "list": [folders], "read":
[files], "connect": [[host, port]], "write_mb": N, "fork": N, "spin_s": S, "link":
{name: target}}`` (a symlink left in its folder, for the parent to read); the result
says, for each, what happened (``"ok"`` or the error's name).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

from autofusion.app.services.sandbox import Progress, SandboxKind, sandbox_main


def _try(action) -> str:
    try:
        action()
    except OSError as exc:
        return type(exc).__name__ if exc.errno is None else f"errno:{exc.errno}"
    return "ok"


def _connect(host: str, port: int) -> None:
    with socket.create_connection((host, port), timeout=2):
        pass


def _write(path: Path, megabytes: int) -> None:
    block = b"\0" * 1024 * 1024
    with open(path, "wb") as f:
        for _ in range(megabytes):
            f.write(block)


def _fork(count: int) -> None:
    children = []
    try:
        for _ in range(count):
            pid = os.fork()
            if pid == 0:
                time.sleep(5)
                os._exit(0)
            children.append(pid)
    finally:
        for pid in children:
            os.kill(pid, 9)
            os.waitpid(pid, 0)


def _work(folder: Path, request: dict[str, Any], _progress: Progress) -> dict[str, Any]:
    targets = request["targets"]
    found: dict[str, Any] = {"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups()}
    if "environ" in targets:
        found["environ"] = _try(lambda: Path(targets["environ"]).read_bytes())
    found["list"] = {p: _try(lambda p=p: os.listdir(p)) for p in targets.get("list", [])}
    found["read"] = {p: _try(lambda p=p: Path(p).read_bytes()) for p in targets.get("read", [])}
    found["connect"] = {
        f"{h}:{p}": _try(lambda h=h, p=p: _connect(h, p)) for h, p in targets.get("connect", [])
    }
    if "write_mb" in targets:
        found["write"] = _try(lambda: _write(folder / "big.bin", targets["write_mb"]))
    if "fork" in targets:
        found["fork"] = _try(lambda: _fork(targets["fork"]))
    found["own_folder"] = _try(lambda: (folder / "mine.txt").write_text("x"))
    found["link"] = {
        name: _try(lambda name=name, target=target: os.symlink(target, folder / name))
        for name, target in targets.get("link", {}).items()
    }
    if "spin_s" in targets:
        end = time.monotonic() + targets["spin_s"]
        while time.monotonic() < end:
            pass
    return found


PROBE = SandboxKind(
    module="tests.sandbox_probe",
    request_file="request.json",
    error_file="error.json",
    result_file="result.json",
    log_file="sandbox.log",
    work=_work,
    describe=lambda exc: {"kind": "internal", "message": f"{type(exc).__name__}: {exc}"},
)

if __name__ == "__main__":
    sys.exit(sandbox_main(PROBE))
