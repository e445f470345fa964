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

from autofusion.app.core.config import Settings
from autofusion.app.main import create_app
from autofusion.app.services.artifacts import LocalStore
from autofusion.app.services.scratch import (
    OWNER_FILE,
    ScratchSweeper,
    held,
    hold,
    sweep_api_scratch,
    write_owner,
)
from autofusion.app.services.uploads import IncomingBody, UploadSlots, receive_upload, remove_folder
from autofusion.worker.reaper import Reaper
from tests.event_loops import run_coroutine
from tests.worker.worker_testing import WorkerEnv

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


def _backdate(folder: Path, age_s: float) -> None:
    then = time.time() - age_s
    for path in [*folder.rglob("*"), folder]:
        os.utime(path, (then, then))


def test_an_upload_held_by_a_request_is_never_swept_however_old(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False)
    held_upload = _folder(settings.uploads_dir, "c" * 32, age_s=2 * HOUR)
    with hold(held_upload):  # a big upload whose check and store outlast the age
        assert sweep_api_scratch(settings) == []
        assert held(held_upload / "input" / "model.onnx")  # what is inside it too
    assert sweep_api_scratch(settings) == [held_upload]


def test_a_streaming_upload_survives_a_sweep_in_the_middle(tmp_path: Path) -> None:
    """The real upload path: receive_upload holds its folder from the first byte until
    remove_folder, so a sweep mid-stream (the folder made to look hours old) keeps it."""
    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False)
    boundary = "sweep-boundary"
    head = (
        f'--{boundary}\r\nContent-Disposition: form-data; name="model"; '
        'filename="m.onnx"\r\nContent-Type: application/octet-stream\r\n\r\n'
    ).encode()
    seen: list[list[Path]] = []

    async def chunks():
        yield head + b"x" * 1000
        (folder,) = settings.uploads_dir.iterdir()
        _backdate(folder, 2 * HOUR)
        seen.append(sweep_api_scratch(settings))
        yield b"y" * 1000 + f"\r\n--{boundary}--\r\n".encode()

    body = IncomingBody(
        f"multipart/form-data; boundary={boundary}", None, chunks(), UploadSlots(4, 4, 1)
    )
    upload = run_coroutine(receive_upload(body, settings))
    assert seen == [[]] and upload.model_path.stat().st_size == 2000
    _backdate(upload.folder, 2 * HOUR)
    assert sweep_api_scratch(settings) == []  # received, not yet checked and stored
    remove_folder(upload.folder)
    assert not upload.folder.exists() and not held(upload.folder)


def test_half_written_blobs_of_the_local_store_are_swept(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False)
    store = LocalStore(settings.artifacts_dir)
    digest = store.put_bytes(b"a blob")
    blob = settings.artifacts_dir / digest[:2] / digest
    stale = [settings.artifacts_dir / "tmpk2j4_x1q", blob.parent / "tmpa8f0zz3c"]
    fresh = blob.parent / "tmpfresh123"
    for path in [*stale, fresh]:
        path.write_bytes(b"half a blob")
    for path in [*stale, blob]:  # the blob is as old: blobs are never swept
        os.utime(path, (time.time() - 2 * HOUR,) * 2)

    assert sorted(sweep_api_scratch(settings)) == sorted(stale)
    assert blob.exists() and fresh.exists() and store.read_bytes(digest) == b"a blob"
    s3 = settings.model_copy(update={"artifact_store": "s3"})  # no local store to sweep
    os.utime(fresh, (time.time() - 2 * HOUR,) * 2)
    assert sweep_api_scratch(s3) == [] and fresh.exists()


def test_the_sweep_runs_again_every_interval(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False)
    now = [1000.0]
    sweeper = ScratchSweeper(
        lambda: sweep_api_scratch(settings), interval_s=300, clock=lambda: now[0]
    )
    assert sweeper.run_due() == []  # the first turn sweeps at once
    late = _folder(settings.uploads_dir, "d" * 32, age_s=2 * HOUR)  # killed after it
    now[0] += 299
    assert sweeper.run_due() is None and late.exists()  # not due yet
    now[0] += 1
    assert sweeper.run_due() == [late] and not late.exists()


def test_the_api_sweeps_periodically_while_it_runs(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path / "data", embedded_worker=False, scratch_sweep_interval_s=0.05
    )
    with TestClient(create_app(settings)) as client:
        assert client.get("/healthz").status_code == 200
        stale = _folder(settings.uploads_dir, "e" * 32, age_s=2 * HOUR)  # after the start
        deadline = time.monotonic() + 30
        while stale.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not stale.exists()
        assert client.app.state.sweeper.running
    assert not client.app.state.sweeper.running  # stopped with the app
