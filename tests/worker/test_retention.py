"""Retention (issue 26; app/services/retention.py), as the reaper sweeps it: ended jobs
past job_retention_s go with their blobs, the oldest ended first while the total passes
max_stored_bytes_total, and never a queued or running job or a blob a job still holds or
that was just stored."""

from __future__ import annotations

import os
import time
from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from sqlalchemy import insert, select, update

from autofusion.app.core.models import Job, JobArtifact, JobStatus, PatternClassRule
from autofusion.app.migrate import downgrade, upgrade
from autofusion.app.services.auth import ensure_tenant
from autofusion.app.services.jobs import claim_job, finish_job
from autofusion.app.services.quotas import stored_bytes
from autofusion.app.services.retention import sweep_retention
from autofusion.worker.reaper import Reaper
from tests.worker.worker_testing import WorkerEnv, new_env

HOUR = 3600.0
NOW = datetime.now(UTC)
# The jobs table as revision 0006 has it (the columns a row needs), for a job stored
# before job_artifacts existed.
_JOBS_0006 = sa.table(
    "jobs",
    *(sa.column(name) for name in ("id", "tenant_id", "status", "stage", "progress")),
    *(sa.column(name) for name in ("revision", "attempts", "max_attempts", "request_hash")),
    *(sa.column(name) for name in ("cancel_requested", "model_name", "model_digest")),
    sa.column("created_at", sa.DateTime(timezone=True)),
    sa.column("updated_at", sa.DateTime(timezone=True)),
    sa.column("config", sa.JSON),
    sa.column("data_files", sa.JSON),
    sa.column("summary", sa.JSON),
)
_JOB_0006 = {
    "id": "before-0007",
    "tenant_id": "acme",
    "status": "succeeded",
    "stage": "succeeded",
    "progress": 1.0,
    "revision": 1,
    "attempts": 1,
    "max_attempts": 3,
    "request_hash": "",
    "cancel_requested": False,
    "model_name": "m.onnx",
    "created_at": NOW,
    "updated_at": NOW,
    "config": {},
    "data_files": [],
}


def _job(env: WorkerEnv, model: bytes, *, tenant: str = "acme", outputs: bytes = b"") -> str:
    """A queued job of ``model``; with ``outputs``, claimed and succeeded, having stored
    them as its fused model."""
    job_id = env.submit(model, tenant=tenant, model_name="m.onnx", config={}, max_attempts=3)
    if outputs:
        fused = env.store.put_bytes(outputs)
        with env.db() as session:
            assert claim_job(session, job_id, "w", 60) is not None
            stored = {fused: len(outputs)}
            finish_job(
                session, job_id, "w", status=JobStatus.succeeded, fused_digest=fused, stored=stored
            )
    return job_id


def _ended(env: WorkerEnv, job_id: str, hours_ago: float) -> None:
    with env.db() as session:
        session.get(Job, job_id).finished_at = NOW - timedelta(hours=hours_ago)


def _age_blobs(env: WorkerEnv, hours: float) -> None:
    """Every blob in the store as if last stored ``hours`` ago."""
    then = time.time() - hours * HOUR
    for path in env.settings.artifacts_dir.rglob("*"):
        if path.is_file():
            os.utime(path, (then, then))


def _blobs(env: WorkerEnv) -> set[str]:
    return {blob.digest for blob in env.store.blobs()}


def _ids(env: WorkerEnv) -> set[str]:
    with env.db() as session:
        return set(session.scalars(select(Job.id)))


@pytest.fixture
def kept(make_env) -> WorkerEnv:
    """Retention of a day, blobs kept an hour after they were last stored, no total cap."""
    return make_env(
        seed=False, job_retention_s=24 * HOUR, scratch_max_age_s=HOUR, max_stored_bytes_total=0
    )


def test_old_ended_jobs_go_with_their_files_and_the_rest_stays(kept) -> None:
    old = _job(kept, b"old model", outputs=b"old fused")
    recent = _job(kept, b"recent model", outputs=b"recent fused")
    failed = _job(kept, b"failed model")
    with kept.db() as session:
        session.get(Job, failed).status = JobStatus.failed.value
    queued = _job(kept, b"queued model")
    running = _job(kept, b"running model")
    with kept.db() as session:
        assert claim_job(session, running, "busy", 600) is not None
    for job_id in (old, failed):
        _ended(kept, job_id, hours_ago=25)
    _ended(kept, recent, hours_ago=1)
    for job_id in (queued, running):  # submitted long ago: age alone never deletes them
        with kept.db() as session:
            session.get(Job, job_id).created_at = NOW - timedelta(days=60)
            session.get(Job, job_id).updated_at = NOW - timedelta(days=60)
    digests = {job_id: kept.job(job_id) for job_id in (old, failed, recent, queued, running)}
    _age_blobs(kept, hours=2)

    swept = sweep_retention(kept.settings, kept.store)
    assert set(swept.expired) == {old, failed}
    assert _ids(kept) == {recent, queued, running}
    gone = {digests[old].model_digest, digests[old].fused_digest, digests[failed].model_digest}
    assert set(swept.blobs) == gone
    assert not gone & _blobs(kept)
    for job_id in (recent, queued, running):  # their models (and recent's output) stay
        assert digests[job_id].model_digest in _blobs(kept)
    assert digests[recent].fused_digest in _blobs(kept)
    with kept.db() as session:
        assert {a.job_id for a in session.scalars(select(JobArtifact))} == {
            recent,
            queued,
            running,
        }


def test_a_blob_another_job_shares_stays_and_a_fresh_blob_waits_for_its_age(kept) -> None:
    old = _job(kept, b"shared model", outputs=b"old fused")
    _job(kept, b"shared model")  # a newer queued job of the same model: the same blob
    _ended(kept, old, hours_ago=25)
    old_job = kept.job(old)
    sweep = sweep_retention(kept.settings, kept.store)  # the blobs were stored just now
    assert sweep.expired == [old] and sweep.blobs == []
    assert old_job.fused_digest in _blobs(kept)  # nobody refers to it, but it is fresh

    _age_blobs(kept, hours=2)
    kept.store.put_bytes(b"old fused")  # stored again (an upload of the same bytes)
    assert sweep_retention(kept.settings, kept.store).blobs == []
    _age_blobs(kept, hours=2)
    assert sweep_retention(kept.settings, kept.store).blobs == [old_job.fused_digest]
    assert old_job.model_digest in _blobs(kept)  # the queued job's model


def test_the_total_cap_removes_the_oldest_ended_jobs_first(make_env) -> None:
    env = make_env(seed=False, job_retention_s=0, max_stored_bytes_total=250)
    jobs = [_job(env, f"model {i}".encode() * 5, outputs=bytes([i]) * 50) for i in range(4)]
    for i, job_id in enumerate(jobs):
        _ended(env, job_id, hours_ago=10 - i)  # jobs[0] ended first
    queued = _job(env, b"q" * 60)
    with env.db() as session:
        total = stored_bytes(session)
    assert total == 4 * (35 + 50) + 60 == 400

    swept = sweep_retention(env.settings, env.store)
    # 400 -> 315 -> 230: the two that ended first go, the queued one never.
    assert swept.over_total == jobs[:2] and swept.expired == []
    assert _ids(env) == {*jobs[2:], queued}
    with env.db() as session:
        assert stored_bytes(session) == 230


def test_the_total_cap_never_takes_a_queued_or_running_job(make_env) -> None:
    env = make_env(seed=False, job_retention_s=0, max_stored_bytes_total=10)
    queued, running = _job(env, b"q" * 100), _job(env, b"r" * 100)
    with env.db() as session:
        assert claim_job(session, running, "busy", 600) is not None
    _age_blobs(env, hours=2)
    swept = sweep_retention(env.settings, env.store)
    assert swept.over_total == [] and swept.blobs == []
    assert _ids(env) == {queued, running}
    assert len(_blobs(env)) == 2


def test_the_reaper_sweeps_retention_when_it_starts_and_each_interval(kept) -> None:
    old = _job(kept, b"old model", outputs=b"old fused")
    _ended(kept, old, hours_ago=25)
    reaper = Reaper(kept.settings, lambda job_id: None)
    reaper._turn()  # the first pass sweeps
    assert _ids(kept) == set()
    second = _job(kept, b"second", outputs=b"second fused")
    _ended(kept, second, hours_ago=25)
    reaper._turn()  # not due yet: scratch_sweep_interval_s has not passed
    assert _ids(kept) == {second}
    assert reaper.retain_once().expired == [second]


def test_the_sweep_lapses_automatic_pattern_rules_past_the_verdicts_age(kept) -> None:
    """An automatic rule older than verdict_max_age_days goes (its evidence is no longer
    reused, and while it stands nothing measures the pattern there again); a person's
    rule as old, and an automatic one made recently, stay."""
    made = {"auto-old": ("auto", 40), "auto-new": ("auto", 1), "person-old": ("key:1", 40)}
    with kept.db() as session:
        for pattern, (by, days) in made.items():
            session.add(
                PatternClassRule(
                    pattern=pattern,
                    machine_key="k" * 64,
                    machine={},
                    reason="slower",
                    evidence={},
                    created_by=by,
                    created_at=NOW - timedelta(days=days),
                )
            )
    swept = sweep_retention(kept.settings, kept.store)
    assert kept.settings.verdict_max_age_days == 30
    assert swept.rules == [("auto-old", "k" * 64)]
    with kept.db() as session:
        left = {rule.pattern for rule in session.scalars(select(PatternClassRule))}
    assert left == {"auto-new", "person-old"}


def test_sizes_of_jobs_stored_before_the_table_are_asked_of_the_store(tmp_path) -> None:
    """The migration records the blobs of the jobs already there (size unknown); the
    sweep asks the store for the sizes, and none of those blobs is taken meanwhile."""
    env = new_env(tmp_path / "data", seed=False, job_retention_s=0, scratch_max_age_s=HOUR)
    url = env.settings.resolved_database_url
    downgrade(url, "0006")
    model, fused = env.store.put_bytes(b"m" * 70), env.store.put_bytes(b"f" * 30)
    with env.db() as session:
        ensure_tenant(session, "acme")
        session.execute(insert(_JOBS_0006).values(**_JOB_0006, model_digest=model))
        session.execute(update(_JOBS_0006).values(summary={"artifacts": {"report.md": fused}}))
    upgrade(url)
    with env.db() as session:
        rows = {(a.digest, a.size) for a in session.scalars(select(JobArtifact))}
    assert rows == {(model, None), (fused, None)}
    _age_blobs(env, hours=2)
    swept = sweep_retention(env.settings, env.store)
    assert swept.sized == 2 and swept.blobs == []
    with env.db() as session:
        assert stored_bytes(session, "acme") == 100
