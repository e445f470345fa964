"""The running-jobs limit per tenant and the fair order of what a worker takes next
(issue 26; app/services/job_claims.py, worker/turns.py): a tenant at its limit leaves its
next job queued while another tenant's job runs, and tenants take turns."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import onnx
import pytest

from autofusion.app.core.models import Job, JobStatus
from autofusion.app.services.job_claims import Pick, is_held, pick_job
from autofusion.app.services.jobs import claim_job, finish_job
from autofusion.app.services.quotas import stored_bytes
from autofusion.fusion_core.testing import conv_bn_relu
from autofusion.worker.celery_app import make_celery
from autofusion.worker.embedded import EmbeddedWorker
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.tasks import enqueue_job
from autofusion.worker.turns import Send, take_turn
from tests.worker.worker_testing import WorkerEnv

MODEL = conv_bn_relu(width=8).SerializeToString()


def _submit(env: WorkerEnv, tenant: str, at: datetime | None = None) -> str:
    job_id = env.submit(MODEL, tenant=tenant, model_name="net.onnx", max_attempts=3)
    if at is not None:
        with env.db() as session:
            session.get(Job, job_id).created_at = at
    return job_id


def _claim(env: WorkerEnv, job_id: str, worker: str, limit: int = 0) -> bool:
    with env.db() as session:
        return claim_job(session, job_id, worker, 600, max_running=limit) is not None


def _end(env: WorkerEnv, job_id: str, worker: str) -> None:
    with env.db() as session:
        assert finish_job(session, job_id, worker, status=JobStatus.succeeded)


def _pick(env: WorkerEnv, job_id: str, limit: int) -> Pick:
    with env.db() as session:
        return pick_job(session, job_id, max_running=limit)


@pytest.fixture
def limited(make_env) -> WorkerEnv:
    return make_env(max_running_jobs_per_tenant=1, lease_s=600, held_job_retry_s=0.5)


def test_a_tenant_at_its_limit_is_passed_over_for_another_tenants_job(limited) -> None:
    start = datetime.now(UTC) - timedelta(minutes=5)
    a1, a2 = (_submit(limited, "a", start + timedelta(seconds=i)) for i in range(2))
    b1 = _submit(limited, "b", start + timedelta(seconds=10))
    assert _claim(limited, a1, "w1", limit=1)

    # A runs its one job: the turn of a2's message goes to b1.
    assert _pick(limited, a2, 1) == Pick(b1)
    assert not _claim(limited, a2, "w2", limit=1)
    with limited.db() as session:
        assert is_held(session, a2, max_running=1)
    assert limited.job(a2).status == "queued"
    assert _claim(limited, b1, "w2", limit=1)

    # Both run their one job: nothing can run, a2 is the job whose turn must come again.
    assert _pick(limited, a2, 1) == Pick(None, held=a2)
    assert _pick(limited, b1, 1) == Pick(None, held=a2)
    _end(limited, a1, "w1")
    assert _pick(limited, b1, 1) == Pick(a2)
    # Without a limit the same rows pick a2 too (nothing else is queued).
    assert _pick(limited, b1, 0) == Pick(a2)


def test_tenants_take_turns_on_one_worker(make_env) -> None:
    env = make_env(max_running_jobs_per_tenant=2)
    start = datetime.now(UTC) - timedelta(minutes=5)
    a = [_submit(env, "a", start + timedelta(seconds=i)) for i in range(3)]
    b1 = _submit(env, "b", start + timedelta(seconds=10))
    assert _pick(env, a[0], 2) == Pick(a[0])  # nobody has started: the oldest job
    assert _claim(env, a[0], "w1")
    _end(env, a[0], "w1")
    # A started a job last; B never did: B's job goes before A's older ones.
    assert _pick(env, a[1], 2) == Pick(b1)
    assert _claim(env, b1, "w1")
    assert _pick(env, a[1], 2) == Pick(a[1])  # B runs one, A none
    _end(env, b1, "w1")
    assert _pick(env, a[2], 2) == Pick(a[1])  # A's oldest, not the message's own


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_a_light_tenant_goes_before_tenants_that_used_the_workers_longer(
    make_env, database, request
) -> None:
    """Goal of issue 26: a normal job waits behind at most its own tenant's work (and
    what runs). Heavy tenants whose jobs each took ten minutes, and started longer ago,
    used to go first on their turn; the light tenant's two-second job goes first now."""
    overrides = {}
    if database == "postgresql":
        overrides["database_url"] = request.getfixturevalue("postgres_url")
    env = make_env(max_running_jobs_per_tenant=2, **overrides)
    now = datetime.now(UTC)
    heavy = [_submit(env, f"heavy{i}", now - timedelta(minutes=50)) for i in range(2)]
    light = _submit(env, "light", now - timedelta(minutes=1))
    queued = {t: _submit(env, t, now - timedelta(seconds=30)) for t in ("heavy0", "heavy1")}
    queued["light"] = _submit(env, "light", now - timedelta(seconds=20))
    ran = {heavy[0]: (40, 10 * 60), heavy[1]: (30, 10 * 60), light: (1, 2)}
    with env.db() as session:
        for job_id, (minutes_ago, seconds) in ran.items():
            job = session.get(Job, job_id)
            job.status = JobStatus.succeeded.value
            job.started_at = now - timedelta(minutes=minutes_ago)
            job.finished_at = job.started_at + timedelta(seconds=seconds)
    assert _pick(env, queued["heavy0"], 2) == Pick(queued["light"])


def test_the_second_job_of_a_tenant_stays_queued_while_another_tenants_runs(limited) -> None:
    a1, a2 = _submit(limited, "a"), _submit(limited, "a")
    b1 = _submit(limited, "b")
    assert _claim(limited, a1, "elsewhere")  # A's one job runs on another worker

    # a2's message arrives at this worker: it runs b1 instead, a2 waits.
    outcome, sends = take_turn(limited.settings, a2, "worker-1", limited.store)
    assert (outcome, sends) == (Outcome.succeeded, []), limited.job(b1).error
    assert limited.job(b1).status == "succeeded"
    assert (limited.job(a2).status, limited.job(a2).attempts) == ("queued", 0)
    # What b1 stored (fused model, report) counts as B's, besides its model.
    with limited.db() as session:
        assert stored_bytes(session, "b") > len(MODEL)

    # b1's message: nothing can run; a2's turn is sent again after held_job_retry_s,
    # and its row says so to the reaper (updated_at), not to clients (revision).
    before = limited.job(a2)
    outcome, sends = take_turn(limited.settings, b1, "worker-1", limited.store)
    assert (outcome, sends) == (Outcome.held, [Send(a2, 0.5)])
    after = limited.job(a2)
    assert after.updated_at > before.updated_at and after.revision == before.revision

    # A claim of a2 itself says held too, and changes nothing but that mark.
    assert execute_job(limited.settings, a2, "worker-1", limited.store) == Outcome.held
    assert limited.job(a2).attempts == 0

    _end(limited, a1, "elsewhere")
    outcome, sends = take_turn(limited.settings, b1, "worker-1", limited.store)
    assert (outcome, sends) == (Outcome.succeeded, [])
    assert limited.job(a2).status == "succeeded"


def test_zero_running_limit_claims_as_before(make_env) -> None:
    env = make_env(max_running_jobs_per_tenant=0)
    jobs = [_submit(env, "a") for _ in range(3)]
    assert all(_claim(env, job_id, f"w{i}") for i, job_id in enumerate(jobs))


@pytest.fixture(params=["sqlite", "postgresql"])
def any_database(request, make_env) -> Iterator[WorkerEnv]:
    options = {}
    if request.param == "postgresql":
        options["database_url"] = request.getfixturevalue("postgres_url")
    yield make_env(seed=False, lease_s=600, **options)


def test_two_workers_cannot_both_take_a_tenants_last_place(any_database) -> None:
    env = any_database
    tenant = f"racer-{uuid.uuid4().hex[:8]}"  # the PostgreSQL database is the module's
    jobs = [_submit(env, tenant) for _ in range(6)]
    start = threading.Barrier(len(jobs))
    claimed: list[str] = []

    def claim(job_id: str) -> None:
        start.wait()
        if _claim(env, job_id, f"worker-{job_id[:8]}", limit=2):
            claimed.append(job_id)

    threads = [threading.Thread(target=claim, args=(job_id,)) for job_id in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert len(claimed) == 2, claimed
    with env.db() as session:
        running = session.query(Job).filter_by(tenant_id=tenant, status="running").count()
    assert running == 2


@pytest.mark.slow
def test_the_embedded_worker_sends_a_held_job_again_until_it_can_run(limited) -> None:
    """Over the filesystem transport: the held job's turn comes back after its countdown
    for as long as its tenant is at its limit, and runs once a place is free."""
    onnx.checker.check_model(onnx.load_from_string(MODEL))
    a1, a2 = _submit(limited, "a"), _submit(limited, "a")
    b1 = _submit(limited, "b")
    assert _claim(limited, a1, "elsewhere")
    worker = EmbeddedWorker(limited.settings, make_celery(limited.settings))
    worker.start(timeout=20)
    try:
        enqueue_job(worker.celery, a2)
        enqueue_job(worker.celery, b1)
        assert limited.wait_final(b1, timeout=60).status == "succeeded"
        held = limited.job(a2)
        limited.wait_for(a2, lambda j: j.updated_at > held.updated_at, timeout=10)
        assert limited.job(a2).status == "queued"  # held, its turn on its way again
        _end(limited, a1, "elsewhere")
        assert limited.wait_final(a2, timeout=60).status == "succeeded"
    finally:
        worker.stop(timeout=10)
