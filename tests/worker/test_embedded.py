"""The embedded worker: a Celery worker thread over kombu's ``filesystem://`` transport
inside this process, SQLite, local artifacts; and hot updates of the pattern registry
applied by that one running worker, job after job, without a restart."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from autofusion.app.services.registry import change_pattern, create_pattern
from autofusion.worker.celery_app import make_celery
from autofusion.worker.embedded import EmbeddedWorker
from autofusion.worker.sandbox import TEST_CRASH_ENV
from autofusion.worker.snapshots import default_cache
from autofusion.worker.tasks import enqueue_job
from tests.worker.worker_testing import GAP_FLATTEN, WorkerEnv, op_types


@pytest.fixture
def embedded(env: WorkerEnv) -> Iterator[EmbeddedWorker]:
    worker = EmbeddedWorker(env.settings, make_celery(env.settings))
    worker.start(timeout=20)
    try:
        yield worker
    finally:
        worker.stop(timeout=10)


@pytest.mark.slow
def test_embedded_worker_runs_a_job_and_stops_quickly(
    env: WorkerEnv, embedded: EmbeddedWorker
) -> None:
    job_id = env.submit()
    enqueue_job(embedded.celery, job_id)
    job = env.wait_final(job_id, timeout=30)
    assert (job.status, job.attempts) == ("succeeded", 1), job.error
    assert f"/{os.getpid()}/" in job.worker_id  # this process ran it
    start = time.monotonic()
    embedded.stop(timeout=10)
    assert time.monotonic() - start < 10
    assert not embedded.running


@pytest.mark.slow
def test_stopping_mid_job_queues_it_again_without_costing_an_attempt(
    env: WorkerEnv, monkeypatch
) -> None:
    celery = make_celery(env.settings)
    monkeypatch.setenv(TEST_CRASH_ENV, "sleep:60")
    worker = EmbeddedWorker(env.settings, celery)
    worker.start(timeout=20)
    try:
        job_id = env.submit()
        enqueue_job(celery, job_id)
        env.wait_for(job_id, lambda j: j.stage == "prepasses", timeout=20)
        start = time.monotonic()
        worker.stop(timeout=10)
        assert time.monotonic() - start < 10
        job = env.job(job_id)
        assert (job.status, job.attempts, job.error) == ("queued", 0, None)
        # The next start finds the message the stopping worker sent back to the queue.
        monkeypatch.delenv(TEST_CRASH_ENV)
        worker = EmbeddedWorker(env.settings, make_celery(env.settings))
        worker.start(timeout=20)
        job = env.wait_final(job_id, timeout=30)
        assert (job.status, job.attempts) == ("succeeded", 1), job.error
    finally:
        worker.stop(timeout=10)


@pytest.mark.slow
def test_pattern_changes_apply_to_the_next_job_without_a_restart(
    env: WorkerEnv, embedded: EmbeddedWorker, tmp_path
) -> None:
    compilations = default_cache.compilations

    def run_job() -> tuple[dict, int]:
        job_id = env.submit()
        enqueue_job(embedded.celery, job_id)
        job = env.wait_final(job_id, timeout=30)
        assert job.status == "succeeded", job.error
        return job, job.registry_version

    first, v1 = run_job()
    assert "test.gap_flatten" not in first.summary["counts"]

    with env.db() as session:
        create_pattern(session, GAP_FLATTEN, actor="test")
    second, v2 = run_job()
    assert v2 > v1
    assert second.summary["counts"]["test.gap_flatten"] == 1
    fused = env.store.fetch(second.fused_digest, tmp_path / "second.onnx")
    assert "GapFlatten" in op_types(fused) and "GlobalAveragePool" not in op_types(fused)

    with env.db() as session:
        change_pattern(session, "test.gap_flatten", "disable", actor="test")
    third, v3 = run_job()
    assert v3 > v2
    assert "test.gap_flatten" not in third.summary["counts"]
    assert third.summary["counts"] == first.summary["counts"]
    # One worker thread the whole time, which compiled each registry version once.
    process = first.worker_id.split("/")[:2]
    assert all(j.worker_id.split("/")[:2] == process for j in (second, third))
    with env.db() as session:
        assert default_cache.versions(session)[-3:] == [v1, v2, v3]
    assert default_cache.compilations - compilations == 3
