"""Scratch folders of killed processes are swept (issue 15, item 7): attempt folders
whose worker is gone, upload folders and download copies nobody has touched for
``scratch_max_age_s``; a folder in use stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from fastapi.testclient import TestClient

from app.core.config import Settings
from app.main import create_app
from app.services.scratch import OWNER_FILE, sweep_api_scratch, write_owner
from tests.worker.worker_testing import WorkerEnv
from worker.reaper import Reaper

HOUR = 3600.0


def _dead_pid() -> int:
    """The pid of a process that has exited (and been reaped)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _folder(root: Path, name: str, *, age_s: float, owner: dict | None | str = None) -> Path:
    """A folder with a file in it, everything last changed ``age_s`` ago; ``owner``:
    "me" (this process), a dict to write as the owner file, or None (no owner file)."""
    folder = root / name
    (folder / "input").mkdir(parents=True)
    (folder / "input" / "model.onnx").write_bytes(b"x" * 100)
    if owner == "me":
        write_owner(folder)
    elif owner is not None:
        (folder / OWNER_FILE).write_text(json.dumps(owner))
    then = time.time() - age_s
    for path in [*folder.rglob("*"), folder]:
        os.utime(path, (then, then))
    return folder


def test_the_reaper_sweeps_attempt_folders_of_dead_workers(env: WorkerEnv) -> None:
    jobs = env.settings.jobs_dir
    mine = {"pid": os.getpid(), "host": os.uname().nodename}
    dead = _folder(jobs / "job-a", "attempt-1", age_s=2 * HOUR, owner=mine | {"pid": _dead_pid()})
    reused = _folder(  # the pid lives, but it is another process: a different start time
        jobs / "job-b", "attempt-1", age_s=2 * HOUR, owner=mine | {"started": 1}
    )
    no_owner = _folder(jobs / "job-c", "attempt-1", age_s=2 * HOUR)
    in_use = _folder(jobs / "job-d", "attempt-1", age_s=2 * HOUR, owner="me")
    recent_dead = _folder(jobs / "job-e", "attempt-2", age_s=60, owner=mine | {"pid": _dead_pid()})
    for job in ("job-a", "job-b", "job-c"):  # the job folders are as old as their attempts
        os.utime(jobs / job, (time.time() - 2 * HOUR,) * 2)

    removed = Reaper(env.settings, lambda _: None).sweep_once()

    for gone in (dead, reused, no_owner):
        assert not gone.exists() and not gone.parent.exists()
    assert in_use.exists() and recent_dead.exists()  # alive, or not old enough yet
    assert set(removed) >= {dead, reused, no_owner}


def test_the_reaper_thread_sweeps_when_the_worker_starts(make_env) -> None:
    env = make_env(scratch_sweep_interval_s=HOUR)
    stale = _folder(env.settings.jobs_dir / "job-a", "attempt-1", age_s=2 * HOUR)
    reaper = Reaper(env.settings, lambda _: None)
    reaper.start()
    try:
        deadline = time.monotonic() + 30
        while stale.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        reaper.stop()
    assert not stale.exists()


def test_the_api_sweeps_stale_uploads_and_downloads_at_start(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False)
    uploads, downloads = settings.uploads_dir, settings.data_dir / "downloads"
    stale_upload = _folder(uploads, "a" * 32, age_s=2 * HOUR)
    live_upload = _folder(uploads, "b" * 32, age_s=2 * HOUR)
    os.utime(live_upload / "input" / "model.onnx")  # still being written: the body streams
    downloads.mkdir(parents=True)
    stale_copy, fresh_copy = downloads / "tmpold", downloads / "tmpnew"
    stale_copy.write_bytes(b"model")
    fresh_copy.write_bytes(b"model")
    os.utime(stale_copy, (time.time() - 2 * HOUR,) * 2)

    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
    assert not stale_upload.exists() and not stale_copy.exists()
    assert live_upload.exists() and fresh_copy.exists()
    assert sweep_api_scratch(settings) == []  # nothing more to do
