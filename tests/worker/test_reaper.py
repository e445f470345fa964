"""Leases: the reaper requeues a dead worker's job, and a worker that lost its lease
walks away without writing."""

from __future__ import annotations

import threading
from datetime import timedelta

from autofusion.app.core.models import Job, utcnow
from autofusion.app.services.jobs import claim_job, reap_jobs
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


def _untouched_for(env: WorkerEnv, job_id: str, minutes: float) -> None:
    with env.db() as session:
        session.get(Job, job_id).updated_at = utcnow() - timedelta(minutes=minutes)


def test_a_job_waiting_behind_busy_workers_is_not_sent_every_pass(make_env) -> None:
    """Issue 26: while a job runs, a queued job waits its turn with its message in the
    broker. Before: it was sent again every minute, by every reaper."""
    env = make_env(queued_resend_busy_s=600)
    busy = env.submit()
    with env.db() as session:
        assert claim_job(session, busy, "busy-worker", 3600) is not None
    waiting = env.submit()
    _untouched_for(env, waiting, 5)
    sent: list[str] = []
    reaper = Reaper(env.settings, sent.append)
    reaper.run_once()
    reaper.run_once()
    assert sent == []
    with env.db() as session:  # a pass a minute for 20 minutes: never
        start = utcnow()
        passes = [
            reap_jobs(session, now=start + timedelta(minutes=m), busy_resend_s=1800)
            for m in range(1, 21)
        ]
    assert passes == [[]] * 20
    # Busy for longer than queued_resend_busy_s: its message may be lost, send it once.
    _untouched_for(env, waiting, 11)
    reaper.run_once()
    reaper.run_once()
    assert sent == [waiting]


def test_a_lost_job_is_sent_again_a_minute_after_the_workers_went_idle(env: WorkerEnv) -> None:
    busy = env.submit()
    with env.db() as session:
        assert claim_job(session, busy, "busy-worker", 3600) is not None
    lost = env.submit()
    _untouched_for(env, lost, 2)
    sent: list[str] = []
    reaper = Reaper(env.settings, sent.append)
    reaper.run_once()
    assert sent == []  # busy: it waits its turn
    with env.db() as session:
        session.get(Job, busy).status = "succeeded"
    reaper.run_once()  # nothing runs, yet it is still queued: no worker holds its message
    reaper.run_once()
    assert sent == [lost]


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
