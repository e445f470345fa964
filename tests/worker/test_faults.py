"""Faults at the end of a job (issue 15, items 5 and 7).

- A database outage at the final write (result, artifacts, status; or the release of a
  crashed attempt) is retried with backoff for ``final_write_retry_s``: the finished
  attempt is kept. Injected at the service boundary on SQLite, and on the real
  PostgreSQL by killing the write's own server connection (the shared server stays up).
- A failed check or an unloadable model is a failed job with a problem type, its report
  still downloadable, through the API, the dashboard and ``autofusion submit``.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import onnx
import pytest
from fastapi.testclient import TestClient
from onnx import TensorProto, helper
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from autofusion.app.cli import main as cli_main
from autofusion.app.cli._exit import EXIT_USAGE
from autofusion.app.core.config import Settings
from autofusion.app.core.errors import JOB_PROBLEMS
from autofusion.app.main import create_app
from autofusion.app.services import db_retry
from autofusion.app.services import jobs as job_service
from autofusion.app.services.db_retry import is_transient_db_error, retry_transient
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.sandbox import TEST_CRASH_ENV
from autofusion.worker.supervise import ChildRun
from autofusion.worker.supervise import run_child as supervise_run_child
from tests.worker.worker_testing import WorkerEnv

PROBLEMS = "https://autofusion.dev/problems/"


def _outage() -> OperationalError:
    """What psycopg raises through SQLAlchemy while the server is down."""
    return OperationalError(
        "UPDATE jobs SET ...", {}, Exception("connection to server failed: Connection refused")
    )


def _failing(real, failures: int, calls: list[str], fault=_outage):
    """``real``, after raising ``fault()`` on its first ``failures`` calls."""

    def wrapper(session, *args, **kwargs):
        calls.append("call")
        if len(calls) <= failures:
            raise fault() if callable(fault) else fault
        return real(session, *args, **kwargs)

    return wrapper


def _no_wait(monkeypatch) -> list[float]:
    """Record the backoff's sleeps instead of sleeping them."""
    delays: list[float] = []
    monkeypatch.setattr(db_retry, "_sleep", delays.append)
    return delays


def test_an_outage_at_the_final_write_keeps_the_finished_attempt(
    env: WorkerEnv, monkeypatch
) -> None:
    calls: list[str] = []
    finish = _failing(job_service.finish_job, 3, calls)
    monkeypatch.setattr("autofusion.worker.execute.finish_job", finish)
    delays = _no_wait(monkeypatch)
    job_id = env.submit()

    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded

    assert len(calls) == 4 and delays == [0.25, 0.5, 1.0]  # exponential backoff
    job = env.job(job_id)
    assert (job.status, job.attempts, job.error, job.error_type) == ("succeeded", 1, None, None)
    assert job.fused_digest and env.store.read_bytes(job.fused_digest)
    report = json.loads(env.store.read_bytes(job.report_digest))
    assert report["check"]["passed"] is True
    for name in ("report.html", "report.md"):
        assert env.store.read_bytes(job.summary["artifacts"][name])


def test_an_outage_at_the_release_of_a_crashed_attempt_still_requeues_it(
    env: WorkerEnv, monkeypatch
) -> None:
    monkeypatch.setenv(TEST_CRASH_ENV, "segv")
    calls: list[str] = []
    monkeypatch.setattr(
        "autofusion.worker.execute.release_job", _failing(job_service.release_job, 2, calls)
    )
    _no_wait(monkeypatch)
    job_id = env.submit(max_attempts=3)
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.requeued
    job = env.job(job_id)
    assert (job.status, job.attempts, len(calls)) == ("queued", 1, 3)
    assert job.attempt_log[0]["outcome"] == "signal:11"


def test_a_dropped_connection_at_a_progress_report_does_not_cost_the_attempt(
    env: WorkerEnv, monkeypatch
) -> None:
    """A DBAPI error that invalidated its connection (not an OperationalError) while
    reporting progress: the attempt goes on and ends succeeded on its first try."""
    dropped = DBAPIError("UPDATE jobs", {}, Exception("gone"), connection_invalidated=True)
    calls: list[str] = []
    report = _failing(job_service.report_progress, 2, calls, fault=dropped)
    monkeypatch.setattr("autofusion.worker.execute.report_progress", report)
    job_id = env.submit()
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    assert env.job(job_id).attempts == 1 and len(calls) > 2


def test_the_final_write_gives_up_after_its_budget(make_env, monkeypatch) -> None:
    """Past ``final_write_retry_s`` the error goes up: the lease runs out and the reaper
    takes the job over, as before."""
    env = make_env(final_write_retry_s=0.5)
    calls: list[str] = []
    monkeypatch.setattr(
        "autofusion.worker.execute.finish_job", _failing(job_service.finish_job, 10**6, calls)
    )
    job_id = env.submit()
    with pytest.raises(OperationalError):
        execute_job(env.settings, job_id, "w1", env.store)
    assert len(calls) >= 2  # retried, then gave up
    job = env.job(job_id)
    assert (job.status, job.worker_id) == ("running", "w1")  # the reaper's to requeue


def test_an_outage_at_the_final_write_on_postgresql(make_env, postgres_url, monkeypatch) -> None:
    """The real driver's error: the write's own connection is terminated by the server
    (as in a restart), twice; the third try, on a new connection, lands."""
    env = make_env(database_url=postgres_url)
    real = job_service.finish_job
    calls: list[str] = []

    def finish(session, *args, **kwargs):
        calls.append("call")
        if len(calls) <= 2:
            session.execute(text("SELECT pg_terminate_backend(pg_backend_pid())"))
        return real(session, *args, **kwargs)

    monkeypatch.setattr("autofusion.worker.execute.finish_job", finish)
    _no_wait(monkeypatch)
    job_id = env.submit()
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    job = env.job(job_id)
    assert (job.status, len(calls)) == ("succeeded", 3)
    assert job.fused_digest and job.summary["artifacts"]["report.html"]


def test_retry_transient_backs_off_and_stops_at_once_for_other_errors(monkeypatch) -> None:
    delays = _no_wait(monkeypatch)
    results = iter([_outage(), _outage(), _outage(), _outage(), _outage(), "done"])

    def flaky():
        result = next(results)
        if isinstance(result, Exception):
            raise result
        return result

    assert retry_transient(flaky, budget_s=60, what="test", max_delay_s=2) == "done"
    assert delays == [0.25, 0.5, 1.0, 2.0, 2.0]

    constraint = IntegrityError("INSERT", {}, Exception("duplicate key"))
    tries: list[int] = []

    def violates():
        tries.append(1)
        raise constraint

    with pytest.raises(IntegrityError):
        retry_transient(violates, budget_s=60, what="test")
    assert tries == [1]  # the same every time: not retried
    invalidated = DBAPIError("SELECT 1", {}, Exception("gone"), connection_invalidated=True)
    assert is_transient_db_error(invalidated) and is_transient_db_error(_outage())
    assert not is_transient_db_error(DBAPIError("SELECT 1", {}, Exception("bad")))


# A failed check or an unloadable model, through the service -------------------------


def test_a_report_with_a_failed_check_never_ends_succeeded(env: WorkerEnv, monkeypatch) -> None:
    """Whatever the child's exit says: here it claims success (exit 0, no error.json)
    over a report whose check failed."""
    real = supervise_run_child

    def lying_child(folder, **kwargs):
        run = real(folder, **kwargs)
        (folder / "output" / "error.json").unlink()
        return ChildRun("exited", 0, run.seconds, run.log_tail)

    monkeypatch.setattr("autofusion.worker.execute.run_child", lying_child)
    job_id = env.submit(
        config={"check": {"rtol": 0, "atol": 0}, "strict": True, "keep_failed": True}
    )
    # keep_failed writes the fused model: the child's output looks complete
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.failed
    job = env.job(job_id)
    assert (job.status, job.error_type) == ("failed", "check-failed")
    assert job.error.startswith("the fused model does not match the original")
    assert job.report_digest and job.summary["check"]["passed"] is False


def _unloadable_model() -> bytes:
    """Valid ONNX that onnxruntime cannot load: an op com.microsoft does not have."""
    graph = helper.make_graph(
        [helper.make_node("NoSuchOp", ["x"], ["y"], domain="com.microsoft")],
        "unloadable",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


@pytest.fixture
def api(tmp_path: Path):
    """The app with no embedded worker: each enqueued job runs at once, as a worker
    would, inside the request that created it."""
    settings = Settings(data_dir=tmp_path / "service", embedded_worker=False)
    app = create_app(settings)
    with TestClient(app) as client:
        outcomes: list[Outcome] = []

        def run(job_id: str) -> None:
            store = app.state.store
            outcomes.append(execute_job(settings, job_id, "worker-1", store))

        app.state.enqueue = run
        client.outcomes = outcomes
        yield client


def _submit(client: TestClient, model: bytes, config: dict | None = None) -> dict:
    files = [("model", ("model.onnx", model, "application/octet-stream"))]
    data = {"config": json.dumps(config)} if config else {}
    response = client.post("/v1/optimize", files=files, data=data)
    assert response.status_code == 202, response.text
    return client.get(response.headers["location"]).json()


@pytest.mark.parametrize(
    ("model", "config", "problem", "failure", "words"),
    [
        pytest.param(
            "unloadable",
            None,
            "model-cannot-run",
            "original_cannot_run",
            "onnxruntime cannot load the original model",
            id="unloadable-model",
        ),
        pytest.param(
            "resnet",
            {"check": {"rtol": 0, "atol": 0}, "strict": True},
            "check-failed",
            "mismatch",
            "does not match the original",
            id="failed-check",
        ),
    ],
)
def test_a_failed_check_or_unloadable_model_is_a_failed_job_with_a_problem_type(
    api: TestClient, model: str, config, problem: str, failure: str, words: str
) -> None:
    from tests.worker.worker_testing import RESNET

    data = _unloadable_model() if model == "unloadable" else RESNET.read_bytes()
    job = _submit(api, data, config)
    assert api.outcomes == [Outcome.failed]
    # error: a problem object of a documented type (error_type: its deprecated mirror)
    assert job["status"] == "failed" and job["error"]["type"] == PROBLEMS + problem
    assert job["error"]["title"] == JOB_PROBLEMS[problem]
    assert job["error_type"] == PROBLEMS + problem
    assert words in job["error"]["detail"] and job["links"]["model"] is None
    report = api.get(job["links"]["report"])
    assert report.status_code == 200
    assert report.json()["check"]["passed"] is False
    assert report.json()["check"]["failure"] == failure
    html = api.get(job["links"]["artifacts"]["report.html"])
    assert html.status_code == 200 and "<html" in html.text.lower()
    assert api.get(f"/v1/jobs/{job['id']}/model").status_code == 409
    page = api.get(f"/ui/jobs/{job['id']}")
    assert page.status_code == 200
    assert 'id="job-error"' in page.text and problem in page.text
    assert "download-report" in page.text


@pytest.mark.filterwarnings("ignore:You should not use the 'timeout' argument")
def test_submit_shows_the_problem_and_writes_the_report(
    api: TestClient, tmp_path: Path, monkeypatch, capsys
) -> None:
    """``autofusion submit --wait``: exit 2 (as optimize exits when the original cannot
    run on the generated inputs), the problem named, the report written."""

    def client_factory(*args, base_url: str = "", **kwargs) -> httpx.Client:
        return api  # the app in this process, whatever the server URL says

    monkeypatch.setattr("autofusion.app.cli._client.httpx.Client", client_factory)
    model = tmp_path / "unloadable.onnx"
    onnx.save_model(onnx.load_from_string(_unloadable_model()), model)
    report = tmp_path / "report.json"
    code = cli_main(
        ["submit", str(model), "--server", "http://testserver", "--wait", "--report", str(report)]
    )
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert "failed (model-cannot-run)" in err and "cannot load the original model" in err
    assert json.loads(report.read_text())["check"]["failure"] == "original_cannot_run"
