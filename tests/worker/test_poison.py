"""A model that crashes or hangs the same way on two attempts is poison after the second
(issue 15, item 7): the job fails then with ``crashed-twice`` (a signal; a limit keeps its
own type, ``time-limit`` or ``memory-limit``: issue 27), not after
``max_attempts`` (a model that always hangs cost 3 x ``job_time_limit_s`` of a worker).
Each attempt's outcome is kept in ``Job.attempt_log`` with the model's digest."""

from __future__ import annotations

from datetime import timedelta

import pytest

from autofusion.app.core.models import utcnow
from autofusion.app.services.jobs import claim_job, reap_jobs
from autofusion.worker.celery_app import make_celery
from autofusion.worker.embedded import EmbeddedWorker
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.sandbox import TEST_CRASH_ENV
from autofusion.worker.tasks import enqueue_job
from tests.worker.worker_testing import WorkerEnv


def test_the_same_signal_twice_fails_the_job_after_the_second_attempt(
    env: WorkerEnv, monkeypatch
) -> None:
    monkeypatch.setenv(TEST_CRASH_ENV, "segv")
    job_id = env.submit(max_attempts=3)
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.requeued
    assert execute_job(env.settings, job_id, "w2", env.store) == Outcome.failed

    job = env.job(job_id)
    assert (job.status, job.attempts, job.error_type) == ("failed", 2, "crashed-twice")
    assert job.error.startswith(
        "the optimization process crashed (signal 11, SIGSEGV), the same way on attempts "
        "1 and 2 (stage prepasses): this model fails like this every time, so it is not "
        "tried again; report it with the model"
    )
    assert '"exclude"' in job.error  # what to try meanwhile
    assert [(e["attempt"], e["outcome"], e["model_digest"]) for e in job.attempt_log] == [
        (1, "signal:11", job.model_digest),
        (2, "signal:11", job.model_digest),
    ]
    # a third message (a duplicate delivery) finds nothing to do
    assert execute_job(env.settings, job_id, "w3", env.store) == Outcome.skipped


def test_the_time_limit_twice_fails_the_job_after_the_second_attempt(make_env, monkeypatch) -> None:
    """An attempt that waited (not computing) until its time limit may do better next
    time: it is tried again, and seen twice, it is poison. The limit leaves the sandbox's
    start (computing, about 2 CPU seconds with onnx and onnxruntime imported) well under
    half of it."""
    env = make_env(job_time_limit_s=8)
    monkeypatch.setenv(TEST_CRASH_ENV, "sleep:60")
    job_id = env.submit(max_attempts=3)
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.requeued
    assert execute_job(env.settings, job_id, "w2", env.store) == Outcome.failed
    job = env.job(job_id)
    # Titled by what happened (issue 27): a time limit, not a crash.
    assert (job.status, job.attempts, job.error_type) == ("failed", 2, "time-limit")
    assert "ran past the time limit of 8 s, the same way on attempts 1 and 2" in job.error
    assert "AUTOFUSION_JOB_TIME_LIMIT_S" in job.error
    assert [e["outcome"] for e in job.attempt_log] == ["timeout", "timeout"]


def test_a_job_that_computes_until_its_time_limit_is_not_tried_again(make_env, monkeypatch) -> None:
    """A hang is not a crash: an attempt that used its CPU all the way to the limit (a
    model that hangs constant folding) would do the same again."""
    env = make_env(job_time_limit_s=2)
    monkeypatch.setenv(TEST_CRASH_ENV, "spin:60")
    job_id = env.submit(max_attempts=3)
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.failed
    job = env.job(job_id)
    assert (job.status, job.attempts, job.error_type) == ("failed", 1, "time-limit")
    assert "ran past the time limit of 2 s" in job.error
    assert "computing all along" in job.error and "not tried again" in job.error
    assert [e["outcome"] for e in job.attempt_log] == ["timeout"]


def test_a_job_that_writes_past_the_file_size_limit_fails_at_once(make_env, monkeypatch) -> None:
    """RLIMIT_FSIZE: the write fails (EFBIG, not a SIGXFSZ death), the job fails as the
    model's doing, with the setting named, and no attempt is spent on a retry."""
    env = make_env(job_file_size_limit_mb=16)
    monkeypatch.setenv(TEST_CRASH_ENV, "write:40")
    job_id = env.submit(max_attempts=3)
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.failed
    job = env.job(job_id)
    assert (job.status, job.attempts, job.error_type) == ("failed", 1, "invalid-model")
    assert "AUTOFUSION_JOB_FILE_SIZE_LIMIT_MB" in job.error
    grown = list(env.settings.jobs_dir.rglob("grown.bin"))
    assert all(path.stat().st_size <= 16 * 1024 * 1024 for path in grown)


def _lose_the_worker(env: WorkerEnv, job_id: str, worker_id: str) -> None:
    """A worker claims the job and dies: its lease runs out, the reaper requeues it."""
    with env.db() as session:
        assert claim_job(session, job_id, worker_id, env.settings.lease_s) is not None
    with env.db() as session:
        assert reap_jobs(session, now=utcnow() + timedelta(hours=1)) == [job_id]


def test_a_lost_worker_is_not_a_deterministic_crash(env: WorkerEnv, monkeypatch) -> None:
    """Twice lost (a worker killed: a deploy, the kernel's OOM killer) costs attempts, as
    before; only a signal, time or memory limit seen twice is the model's doing."""
    job_id = env.submit(max_attempts=4)
    _lose_the_worker(env, job_id, "gone-1")
    _lose_the_worker(env, job_id, "gone-2")
    monkeypatch.setenv(TEST_CRASH_ENV, "segv")
    assert execute_job(env.settings, job_id, "w3", env.store) == Outcome.requeued
    assert execute_job(env.settings, job_id, "w4", env.store) == Outcome.failed
    job = env.job(job_id)
    assert (job.attempts, job.error_type) == (4, "crashed-twice")
    assert "attempts 3 and 4" in job.error
    outcomes = [e["outcome"] for e in job.attempt_log]
    assert outcomes == ["lost", "lost", "signal:11", "signal:11"]


def test_a_job_out_of_attempts_after_lost_workers_is_worker_lost(env: WorkerEnv) -> None:
    job_id = env.submit(max_attempts=1)
    with env.db() as session:
        claim_job(session, job_id, "gone", env.settings.lease_s)
    with env.db() as session:
        assert reap_jobs(session, now=utcnow() + timedelta(hours=1)) == []
    job = env.job(job_id)
    assert (job.status, job.error_type) == ("failed", "worker-lost")
    assert job.attempt_log[0]["outcome"] == "lost"


@pytest.mark.slow
def test_a_segfaulting_model_ends_after_two_attempts_in_a_running_worker(
    env: WorkerEnv, monkeypatch
) -> None:
    """Through Celery: the requeued message runs the second attempt, and no third."""
    monkeypatch.setenv(TEST_CRASH_ENV, "segv")
    celery = make_celery(env.settings)
    worker = EmbeddedWorker(env.settings, celery)
    worker.start(timeout=20)
    try:
        job_id = env.submit(max_attempts=3)
        enqueue_job(celery, job_id)
        job = env.wait_final(job_id, timeout=60)
    finally:
        worker.stop(timeout=10)
    assert (job.status, job.attempts, job.error_type) == ("failed", 2, "crashed-twice")
