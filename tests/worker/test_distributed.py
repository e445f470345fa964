"""Distributed mode for real: ``autofusion worker`` processes on PostgreSQL and Redis.

Each test module gets a fresh PostgreSQL database (dropped afterwards) and each test its
own Redis database number (flushed afterwards), so nothing here touches other data.
Skipped when PostgreSQL or Redis is not running on 127.0.0.1 (``.ci/run`` starts both).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from autofusion.app.core.models import JobStatus
from autofusion.app.services.jobs import claim_job, finish_job
from autofusion.worker.celery_app import QUEUE, make_celery
from autofusion.worker.sandbox import TEST_CRASH_ENV
from autofusion.worker.tasks import enqueue_job
from tests.worker.worker_testing import REPO, WorkerEnv, new_env

pytestmark = pytest.mark.slow

REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
LEASE_S = 3


@pytest.fixture
def cluster(
    tmp_path: Path, postgres_url: str, redis_db: redis.Redis
) -> Iterator[tuple[WorkerEnv, dict]]:
    """The env the test submits with, and the AUTOFUSION_* variables a worker gets."""
    number = redis_db.connection_pool.connection_kwargs["db"]
    variables = {
        "AUTOFUSION_DATABASE_URL": postgres_url,
        "AUTOFUSION_BROKER_URL": f"redis://{REDIS_HOST}:{REDIS_PORT}/{number}",
        "AUTOFUSION_DATA_DIR": str(tmp_path / "shared"),
        "AUTOFUSION_LEASE_S": str(LEASE_S),
        "AUTOFUSION_REAPER_INTERVAL_S": "0.5",
        "AUTOFUSION_JOB_TIME_LIMIT_S": "60",
        "AUTOFUSION_VISIBILITY_TIMEOUT_S": "120",
    }
    env = new_env(
        tmp_path / "shared",
        database_url=postgres_url,
        broker_url=variables["AUTOFUSION_BROKER_URL"],
        lease_s=LEASE_S,
        job_time_limit_s=60,
        visibility_timeout_s=120,
    )
    yield env, variables


class WorkerProcess:
    """``autofusion worker`` in its own process group, so a kill takes all of it."""

    def __init__(self, variables: dict, log: Path, **extra: str) -> None:
        environment = {k: v for k, v in os.environ.items() if not k.startswith("AUTOFUSION_")}
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from autofusion.app.cli import main; sys.exit(main())",
                ]
                + ["worker", "--pool", "prefork", "--concurrency", "1"],
                cwd=REPO,
                env={**environment, **variables, **extra},
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)

    def stop(self) -> int:
        """Warm shutdown (SIGTERM), as docker stop does."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()
                pytest.fail(f"the worker ignored SIGTERM; log:\n{self.log_text()}")
        return self.proc.returncode

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-5000:]


def processes_mentioning(fragment: str) -> list[int]:
    """Pids whose command line contains ``fragment`` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if fragment.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def queue_is_drained(client: redis.Redis, timeout: float = 10.0) -> bool:
    """No message waiting in the queue and none delivered but unacknowledged."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        queues = [k for k in client.scan_iter(f"{QUEUE}*") if client.type(k) == b"list"]
        waiting = sum(client.llen(key) for key in queues)
        if waiting == 0 and client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0:
            return True
        time.sleep(0.2)
    return False


def test_a_killed_worker_s_job_is_taken_over(cluster, tmp_path: Path) -> None:
    env, variables = cluster
    first = WorkerProcess(variables, tmp_path / "worker1.log", **{TEST_CRASH_ENV: "sleep:5"})
    second = None
    try:
        job_id = env.submit(max_attempts=3)
        enqueue_job(make_celery(env.settings), job_id)
        running = env.wait_for(
            job_id, lambda j: j.status == "running" and j.stage == "prepasses", timeout=30
        )
        assert running.attempts == 1
        first.kill()
        # The sandbox child notices its worker died and goes too: no orphan.
        deadline = time.monotonic() + 5
        while processes_mentioning(f"{job_id}/attempt-1") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_mentioning(f"{job_id}/attempt-1") == []
        second = WorkerProcess(variables, tmp_path / "worker2.log")
        job = env.wait_final(job_id, timeout=40)
        assert (job.status, job.attempts) == ("succeeded", 2), second.log_text()
        assert job.worker_id != running.worker_id
        assert second.stop() == 0
    finally:
        for worker in (first, second):
            if worker is not None and worker.proc.poll() is None:
                worker.kill()


def test_a_model_that_always_crashes_fails_and_leaves_the_queue_empty(
    cluster, redis_db: redis.Redis, tmp_path: Path
) -> None:
    env, variables = cluster
    worker = WorkerProcess(variables, tmp_path / "worker.log", **{TEST_CRASH_ENV: "segv"})
    try:
        job_id = env.submit(max_attempts=3)
        enqueue_job(make_celery(env.settings), job_id)
        job = env.wait_final(job_id, timeout=40)
        # the same crash twice: poison after the second attempt (tests/worker/test_poison.py)
        assert (job.status, job.attempts) == ("failed", 2), worker.log_text()
        assert job.error_type == "crashed-twice"
        assert "crashed (signal 11, SIGSEGV), the same way on attempts 1 and 2" in job.error
        assert worker.proc.poll() is None, "the worker died with its job"
        assert queue_is_drained(redis_db), (sorted(redis_db.keys()), worker.log_text())
        assert worker.stop() == 0
    finally:
        if worker.proc.poll() is None:
            worker.kill()


def test_the_worker_refuses_a_visibility_timeout_shorter_than_the_job_limit(
    tmp_path: Path,
) -> None:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("AUTOFUSION_")}
    environment |= {"AUTOFUSION_JOB_TIME_LIMIT_S": "900", "AUTOFUSION_VISIBILITY_TIMEOUT_S": "600"}
    done = subprocess.run(
        [sys.executable, "-c", "import sys; from autofusion.app.cli import main; sys.exit(main())"]
        + ["worker", "--broker", "redis://127.0.0.1:6379/0", "--data-dir", str(tmp_path)],
        cwd=REPO,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "autofusion worker: error: invalid settings: settings: visibility_timeout_s (600) "
        "must exceed job_time_limit_s (900), or Redis re-delivers running jobs"
    )
    assert not (tmp_path / "jobs").exists()


def test_a_held_job_comes_back_after_its_countdown_and_runs_once_a_place_is_free(
    cluster, redis_db: redis.Redis, tmp_path: Path
) -> None:
    """The running limit over Redis with a prefork worker (worker/turns.py): the turn of
    a job whose tenant is at its limit is sent again with a countdown until it can run."""
    env, variables = cluster
    limits = {"AUTOFUSION_MAX_RUNNING_JOBS_PER_TENANT": "1", "AUTOFUSION_HELD_JOB_RETRY_S": "0.5"}
    worker = WorkerProcess({**variables, **limits}, tmp_path / "worker.log")
    try:
        running, held = env.submit(), env.submit()  # both of the test tenant
        with env.db() as session:  # the first runs on a worker elsewhere, for a long lease
            assert claim_job(session, running, "elsewhere", 600) is not None
        enqueue_job(make_celery(env.settings), held)
        before = env.job(held)
        env.wait_for(held, lambda j: j.updated_at > before.updated_at, timeout=30)
        time.sleep(1.5)  # several countdowns: still queued, not a single attempt
        assert (env.job(held).status, env.job(held).attempts) == ("queued", 0)
        with env.db() as session:
            assert finish_job(session, running, "elsewhere", status=JobStatus.succeeded)
        job = env.wait_final(held, timeout=60)
        assert (job.status, job.attempts) == ("succeeded", 1), worker.log_text()
        assert queue_is_drained(redis_db), (sorted(redis_db.keys()), worker.log_text())
    finally:
        worker.stop()
