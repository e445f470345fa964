"""Leases: the reaper requeues a dead worker's job, and a worker that lost its lease
walks away without writing."""

from __future__ import annotations

import threading
from datetime import timedelta

from autofusion.app.core.models import Job, utcnow
from autofusion.app.services.jobs import claim_job
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.reaper import Reaper
from autofusion.worker.sandbox import TEST_CRASH_ENV
from tests.worker.worker_testing import WorkerEnv


def _expire(env: WorkerEnv, job_id: str) -> None:
    with env.db() as session:
        session.get(Job, job_id).lease_until = utcnow() - timedelta(seconds=1)


def test_the_reaper_requeues_expired_leases_until_attempts_run_out(env: WorkerEnv) -> None:
    job_id = env.submit(max_attempts=2)
    sent: list[str] = []
    reaper = Reaper(env.settings, sent.append)
    for attempt in (1, 2):
        with env.db() as session:
            assert claim_job(session, job_id, f"dead-{attempt}", 60) is not None
        assert reaper.run_once() == []  # the lease still holds
        _expire(env, job_id)
        reaper.run_once()
        job = env.job(job_id)
        if attempt == 1:
            assert sent == [job_id] and (job.status, job.worker_id) == ("queued", None)
    assert (job.status, job.attempts, sent) == ("failed", 2, [job_id])
    assert "stopped 2 time(s)" in job.error


def test_a_stale_queued_job_is_sent_again_once_per_period(env: WorkerEnv) -> None:
    job_id = env.submit()
    with env.db() as session:
        session.get(Job, job_id).updated_at = utcnow() - timedelta(minutes=5)
    sent: list[str] = []
    reaper = Reaper(env.settings, sent.append)
    reaper.run_once()
    reaper.run_once()
    assert sent == [job_id]


def test_a_worker_that_lost_its_lease_stops_without_writing(make_env, monkeypatch) -> None:
    env = make_env(lease_s=1)
    monkeypatch.setenv(TEST_CRASH_ENV, "sleep:60")
    job_id = env.submit()
    outcome: list[Outcome] = []
    runner = threading.Thread(
        target=lambda: outcome.append(execute_job(env.settings, job_id, "slow", env.store))
    )
    runner.start()
    env.wait_for(job_id, lambda j: j.stage == "prepasses", timeout=15)
    # As if the lease had run out and another worker had claimed the job.
    with env.db() as session:
        session.get(Job, job_id).worker_id = "other"
    runner.join(timeout=10)
    assert outcome == [Outcome.lost]
    job = env.job(job_id)
    assert (job.status, job.worker_id, job.attempts) == ("running", "other", 1)
