"""A pinned side virtual environment for exporters that cannot live in the project's venv.

Why: two exports need packages that conflict with the project's own pins.
optimum-onnx 0.1.0 requires transformers < 4.58 (the project pins 5.24), and
ultralytics needs a torchvision that imports, which PyPI only has beside torch 2.14
(the project pins torch 2.13.0, whose CPU build PyPI's torchvision 0.28 does not import
beside). Each gets its own venv under the corpus cache, installed from the package
registries with pinned versions; a stamp file records the pins, so a second run
installs nothing and a changed pin rebuilds the venv.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

log = logging.getLogger("export_torch")
STAMP = "autofusion-pins.txt"
INSTALL_TIMEOUT_S = 3600  # torch 2.14 from PyPI is a CUDA build (~5.5 GB)


class SideVenvError(RuntimeError):
    """A side venv that could not be created or whose worker failed; says which."""


def ensure(venv: Path, pins: list[str]) -> Path:
    """The venv's python, creating or rebuilding the venv when its pins differ."""
    python = venv / "bin" / "python"
    stamp = venv / STAMP
    wanted = "\n".join(pins) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    log.info("creating %s with %s (once)", venv, " ".join(pins))
    shutil.rmtree(venv, ignore_errors=True)
    _run([sys.executable, "-m", "venv", str(venv)], "create the venv")
    _run([str(python), "-m", "pip", "install", "--quiet", *pins], f"pip install {pins}")
    stamp.write_text(wanted)
    return python


def run_worker(
    python: Path,
    script: Path,
    args: list[str],
    *,
    env: dict[str, str] | None = None,
    cwd: str | Path | None = None,
    timeout_s: int = 900,
) -> None:
    """Run ``script`` (a worker module beside this one) in the side venv."""
    full_env = dict(os.environ, PYTHONPATH=str(script.parent), **(env or {}))
    cmd = [str(python), str(script), *args]
    _run(cmd, script.name, env=full_env, cwd=cwd, timeout_s=timeout_s)


def _run(
    cmd: list[str], what: str, *, env=None, cwd=None, timeout_s: int = INSTALL_TIMEOUT_S
) -> None:
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as err:
        raise SideVenvError(f"{what}: no result after {timeout_s} s") from err
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SideVenvError(f"{what} failed (exit {done.returncode}):\n{tail}")
