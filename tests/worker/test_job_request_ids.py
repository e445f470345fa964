"""A job's request id follows it into the worker (issue 18): the worker's log lines for
the job carry the id of the request that created it (``Job.request_id``) and the job's
id, and so do the sandbox child's own lines in ``sandbox.log``."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pytest

from autofusion.app.core.logs import bind, current_request_id
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.sandbox import TEST_CRASH_ENV
from tests.log_capture import json_log_lines
from tests.log_capture import records as parsed
from tests.worker.worker_testing import WorkerEnv


@pytest.fixture
def worker_lines() -> Iterator[io.StringIO]:
    with json_log_lines() as stream:
        yield stream


def test_the_worker_and_the_sandbox_log_under_the_jobs_request_id(
    make_env, monkeypatch, worker_lines
) -> None:
    env: WorkerEnv = make_env(log_format="json")
    with bind(request_id="req-from-ci-7"):
        job_id = env.submit(max_attempts=3)
    assert env.job(job_id).request_id == "req-from-ci-7"
    assert current_request_id() is None  # the block's id ended with it

    # The child logs as it starts, then crashes: the worker logs its output's tail.
    monkeypatch.setenv(TEST_CRASH_ENV, "segv")
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.requeued
    assert current_request_id() is None  # nor does the job's outlive the attempt

    records = parsed(worker_lines)
    worker = [r for r in records if r["logger"] == "autofusion.worker.execute"]
    assert len(worker) >= 3  # the attempt, the child's output, the crash
    assert all(r["request_id"] == "req-from-ci-7" and r["job_id"] == job_id for r in worker)
    tail = next(r for r in worker if "sandbox output" in r["message"])["message"]
    child = [json.loads(line) for line in tail.splitlines() if line.startswith("{")]
    started = next(r for r in child if r["message"].startswith("sandbox: optimizing"))
    assert (started["request_id"], started["job_id"]) == ("req-from-ci-7", job_id)
    assert started["process"] != worker[0]["process"]  # the child's own line
