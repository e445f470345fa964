"""``execute_job`` without Celery: one attempt from the claim to the finished row, with a
real sandboxed child process, on SQLite and a local store in ``tmp_path``."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import onnx
import pytest

from autofusion.app.core.models import JobStatus
from autofusion.app.services import jobs as job_service
from autofusion.app.services.jobs import cancel_job, claim_job
from autofusion.app.services.registry import registry_version
from autofusion.fusion_core.report import read_report
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.plan import merge_strategy
from autofusion.worker.sandbox import TEST_CRASH_ENV
from tests.worker.worker_testing import RESNET, WorkerEnv, assert_same_outputs, op_types


def test_a_job_runs_end_to_end(env: WorkerEnv, tmp_path: Path, monkeypatch) -> None:
    stages: list[str] = []
    real_report = job_service.report_progress

    def recording(session, job_id, worker_id, stage, *args, **kwargs):
        stages.append(stage)
        return real_report(session, job_id, worker_id, stage, *args, **kwargs)

    monkeypatch.setattr("autofusion.worker.execute.report_progress", recording)
    job_id = env.submit()

    assert execute_job(env.settings, job_id, "worker-1", env.store) == Outcome.succeeded

    job = env.job(job_id)
    assert (job.status, job.stage, job.progress, job.attempts) == ("succeeded", "succeeded", 1, 1)
    assert job.error is None
    with env.db() as session:
        assert job.registry_version == registry_version(session) > 0
    fused = env.store.fetch(job.fused_digest, tmp_path / "fused.onnx")
    assert "BatchNormalization" not in op_types(fused)
    assert_same_outputs(RESNET, fused, atol=1e-4)
    report = json.loads(env.store.read_bytes(job.report_digest))
    summary = job.summary
    assert summary["counts"] == report["fusions"] and summary["counts"]["conv_bn_relu"] > 0
    assert summary["check"]["passed"] is True and summary["check"]["max_abs_diff"] < 1e-4
    assert summary["nodes"]["after"] < summary["nodes"]["before"]
    assert summary["registry_version"] == job.registry_version
    assert summary["target"] == "generic" and summary["timings"]["sandbox"] > 0
    assert report["model"] == "resnet.onnx" and report["output"] == "resnet.fused.onnx"
    # Stage boundaries in order (heartbeats may repeat one), then no scratch left behind.
    assert [s for i, s in enumerate(stages) if i == 0 or stages[i - 1] != s] == [
        "fetching",
        "prepasses",
        "fusing",
        "checking",
        "saving",
        "report",
        "storing",
    ]
    assert not (env.settings.jobs_dir / job_id).exists()
    # The report's renderings are stored beside it, and the regions for the dashboard.
    assert set(summary["artifacts"]) == {"report.html", "report.md", "regions.json"}
    regions = json.loads(env.store.read_bytes(summary["artifacts"]["regions.json"]))
    assert regions["total"] >= 1 and regions["regions"][0]["before"]["nodes"]
    html = env.store.read_bytes(summary["artifacts"]["report.html"]).decode()
    assert "<svg" in html and "conv_bn_relu" in html
    markdown = env.store.read_bytes(summary["artifacts"]["report.md"]).decode()
    assert "conv_bn_relu" in markdown
    assert report["digests"]["model_sha256"] == job.model_digest


def test_a_job_can_profile_and_validate_progressively(env: WorkerEnv) -> None:
    config = {"progressive": True, "profile": True, "precision": "fp16"}
    job_id = env.submit(config=config)
    assert execute_job(env.settings, job_id, "worker-1", env.store) == Outcome.succeeded
    job = env.job(job_id)
    report = json.loads(env.store.read_bytes(job.report_digest))
    assert report["rollbacks"] == [] and report["check"]["passed"] is True
    assert {level["level"] for level in report["profile"]["latency"]} == {
        "ORT_ENABLE_ALL",
        "ORT_DISABLE_ALL",
    }
    assert report["precision"] is not None
    facts = read_report(report)  # the sandbox measured each model's peak memory
    assert facts.peak_memory_before_bytes > 0 and facts.peak_memory_after_bytes > 0
    assert report["memory"]["errors"] == [] and "VmHWM" in report["memory"]["measure"]
    assert facts.size_after_bytes == len(env.store.read_bytes(job.fused_digest))


def test_a_model_with_external_data(env: WorkerEnv, tmp_path: Path) -> None:
    model = onnx.load(RESNET)
    folder = tmp_path / "upload"
    folder.mkdir()
    onnx.save_model(model, folder / "net.onnx", save_as_external_data=True, location="net.weights")
    assert (folder / "net.onnx").stat().st_size < 100_000  # the weights are elsewhere
    job_id = env.submit(
        folder / "net.onnx", model_name="net.onnx", data_files=(folder / "net.weights",)
    )
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    job = env.job(job_id)
    assert job.summary["check"]["passed"] is True, job.summary
    # As it came: the weights in a data file, named as the fused model's download is.
    (data,) = job.summary["fused_data_files"]
    assert data["name"] == "net.fused.onnx.data"
    fused = env.store.fetch(job.fused_digest, tmp_path / "net.fused.onnx")
    env.store.fetch(data["digest"], tmp_path / data["name"])
    assert_same_outputs(RESNET, fused, atol=1e-4)
    report = json.loads(env.store.read_bytes(job.report_digest))
    weights = (folder / "net.weights").stat().st_size
    assert report["size"]["before_bytes"] == (folder / "net.onnx").stat().st_size + weights
    assert report["size"]["before_external_data_bytes"] == weights
    # BN folded away: fewer bytes, nearly all of them in the data file
    after_data = (tmp_path / data["name"]).stat().st_size
    assert report["size"]["after_external_data_bytes"] == after_data
    assert report["size"]["after_bytes"] == Path(fused).stat().st_size + after_data
    assert report["size"]["after_bytes"] < report["size"]["before_bytes"]
    # nearly all of them: the graph and its provenance are a tenth of the weights at most
    assert Path(fused).stat().st_size < after_data / 10
    assert report["memory"] is None  # not profiled


def test_only_one_claim_wins(env: WorkerEnv) -> None:
    job_id = env.submit()
    barrier, winners = threading.Barrier(6), []

    def claim(worker: str) -> None:
        barrier.wait(timeout=10)
        with env.db() as session:
            if claim_job(session, job_id, worker, 60) is not None:
                winners.append(worker)

    threads = [threading.Thread(target=claim, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(winners) == 1
    job = env.job(job_id)
    assert (job.status, job.worker_id, job.attempts) == ("running", winners[0], 1)
    # Another delivery of the same message while the winner works: nothing happens.
    assert execute_job(env.settings, job_id, "late", env.store) == Outcome.skipped
    assert env.job(job_id).revision == job.revision


def test_a_finished_job_is_not_run_again(env: WorkerEnv) -> None:
    job_id = env.submit()
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    before = env.job(job_id)
    assert execute_job(env.settings, job_id, "w2", env.store) == Outcome.skipped
    after = env.job(job_id)
    assert (after.status, after.attempts, after.revision, after.worker_id) == (
        "succeeded",
        1,
        before.revision,
        "w1",
    )


def test_a_crashing_child_costs_attempts_then_fails_the_job(env: WorkerEnv, monkeypatch) -> None:
    # The same crash twice ends the job sooner: tests/worker/test_poison.py.
    job_id = env.submit(max_attempts=3)
    time_limit = env.settings.job_time_limit_s
    for attempt, crash, problem in ((1, "segv", "crashed"), (2, "sleep:60", "time-limit")):
        monkeypatch.setenv(TEST_CRASH_ENV, crash)
        if attempt == 2:  # a different crash: the time limit, reached waiting (the
            # sandbox's start, about 2 CPU seconds, well under half of it)
            monkeypatch.setattr(env.settings, "job_time_limit_s", 8)
        assert execute_job(env.settings, job_id, f"w{attempt}", env.store) == Outcome.requeued
        job = env.job(job_id)
        assert (job.status, job.attempts, job.worker_id) == ("queued", attempt, None)
        # Queued again, it says why the attempt failed, typed (the API's error object).
        assert f"attempt {attempt} of 3" in job.error and job.error_type == problem
    assert "time limit" in job.error
    monkeypatch.delenv(TEST_CRASH_ENV)  # a third kind: the memory limit
    monkeypatch.setattr(env.settings, "job_memory_limit_mb", 64)
    # reached in the sandbox: the prediction would refuse the job before it starts
    monkeypatch.setattr(env.settings, "job_memory_prediction", False)
    # ... alone: with attempt 2's 8 s still set, the two limits race (a child that takes
    # more than 1 s to reach its first big allocation ends on the time limit instead)
    monkeypatch.setattr(env.settings, "job_time_limit_s", time_limit)
    assert execute_job(env.settings, job_id, "w3", env.store) == Outcome.failed
    job = env.job(job_id)
    assert (job.status, job.attempts, job.error_type) == ("failed", 3, "memory-limit")
    assert job.error == (
        "the optimization ran out of memory (limit 64 MB); gave up after 3 attempts"
    )
    assert [e["outcome"] for e in job.attempt_log] == ["signal:11", "timeout", "memory"]
    assert job.fused_digest is None and job.registry_version is not None


@pytest.mark.parametrize(
    ("settings", "crash", "message"),
    [
        pytest.param(
            # Waiting, not computing (the sandbox's start, about 2 s of CPU with onnx and
            # onnxruntime imported, is well under half of the limit): a crash, given up
            # after its one attempt.
            {"job_time_limit_s": 8},
            "sleep:60",
            "the optimization ran past the time limit of 8 s; gave up after 1 attempt",
            id="time-limit",
        ),
        pytest.param(
            # reached in the sandbox: the prediction (tests/worker/test_memory_plan.py)
            # would refuse the job before it starts
            {"job_memory_limit_mb": 64, "job_memory_prediction": False},
            None,
            "the optimization ran out of memory (limit 64 MB); gave up after 1 attempt",
            id="memory-limit",
        ),
    ],
)
def test_limits_fail_the_job_not_the_worker(
    make_env, monkeypatch, settings: dict, crash: str | None, message: str
) -> None:
    env = make_env(**settings)
    if crash:
        monkeypatch.setenv(TEST_CRASH_ENV, crash)
    job_id = env.submit(max_attempts=1)
    start = time.monotonic()
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.failed
    assert time.monotonic() - start < 15
    job = env.job(job_id)
    assert (job.status, job.attempts, job.error) == ("failed", 1, message)


def test_user_errors_fail_at_once(env: WorkerEnv) -> None:
    not_onnx = env.submit(b"this is not a model", model_name="junk.onnx")
    unknown_pattern = env.submit(config={"patterns": ["no.such_pattern"]})
    bad_option = env.submit(config={"target": "tpu"})
    no_strategy = env.submit(strategy="gone")
    for job_id in (not_onnx, unknown_pattern, bad_option, no_strategy):
        assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.failed
    errors = {job_id: env.job(job_id) for job_id in (not_onnx, unknown_pattern, bad_option)}
    assert all(j.attempts == 1 and j.status == "failed" for j in errors.values())
    assert (
        "junk.onnx" in errors[not_onnx].error and "not a valid ONNX model" in errors[not_onnx].error
    )
    assert "unknown pattern name(s) ['no.such_pattern']" in errors[unknown_pattern].error
    assert errors[bad_option].error.startswith("invalid options: target:")
    assert "strategy 'gone' does not exist" in env.job(no_strategy).error


def test_a_model_with_text_that_is_not_utf8_fails_as_a_model_error(env: WorkerEnv) -> None:
    """Issue 26: a doc string that is not UTF-8 (protobuf parses it, as bytes) used to fail
    the job as an internal error, when onnx-ir wrote the model back; it is the model's
    fault, and the message names the field."""
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4])],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 4])],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)])
    model.doc_string = "PLACEHOLD"
    content = model.SerializeToString().replace(b"PLACEHOLD", b"bad\xff\xfe\xc3\x28xx")
    job_id = env.submit(content, model_name="text.onnx", max_attempts=3)
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.failed
    job = env.job(job_id)
    assert (job.status, job.attempts, job.error_type) == ("failed", 1, "invalid-model")
    assert "its field doc_string is not valid UTF-8" in job.error


def test_a_strategy_is_merged_under_the_job_config(env: WorkerEnv) -> None:
    from autofusion.app.services.strategies import StrategySpec, create_strategy

    with env.db() as session:
        spec = StrategySpec(name="heads", patterns=["conv_bn", "conv_bn_relu"], target="generic")
        create_strategy(session, spec)
    job_id = env.submit(config={"exclude": ["conv_bn"]}, strategy="heads")
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    summary = env.job(job_id).summary
    assert set(summary["counts"]) == {"conv_bn_relu"}
    assert summary["strategy"] == {"name": "heads", "version": 1}


def test_merge_strategy() -> None:
    strategy = {"patterns": ["a", "b"], "exclude": ["c"], "target": "onnxruntime"}
    job = {"target": "generic", "exclude": ["d", "c"], "check": {"atol": 1e-3}}
    assert merge_strategy(strategy, job) == {
        "patterns": ["a", "b"],
        "exclude": ["c", "d"],
        "target": "generic",
        "check": {"atol": 1e-3},
    }


def test_cancelling_a_running_job_kills_its_child(make_env, monkeypatch) -> None:
    env = make_env(lease_s=1)  # heartbeats (and so cancellation checks) every 0.5 s
    monkeypatch.setenv(TEST_CRASH_ENV, "sleep:60")
    job_id = env.submit()
    outcome: list[Outcome] = []
    runner = threading.Thread(
        target=lambda: outcome.append(execute_job(env.settings, job_id, "w1", env.store))
    )
    runner.start()
    env.wait_for(job_id, lambda j: j.stage == "prepasses", timeout=15)
    with env.db() as session:
        cancel_job(session, session.get(job_service.Job, job_id))
    runner.join(timeout=10)
    assert not runner.is_alive()
    assert outcome == [Outcome.cancelled]
    job = env.job(job_id)
    assert (job.status, job.attempts) == (JobStatus.cancelled, 1)


def test_a_failed_check_fails_the_job_and_keeps_the_report(env: WorkerEnv, tmp_path) -> None:
    # Folding BN into a conv changes the last bits, which a zero tolerance sees; strict
    # fails the job instead of falling back (tests/app/test_fallback_jobs.py).
    strict = {"check": {"rtol": 0, "atol": 0}, "strict": True}
    failed = env.submit(config=strict)
    kept = env.submit(config=strict | {"keep_failed": True})
    for job_id in (failed, kept):
        assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.failed
    job = env.job(failed)
    assert job.attempts == 1 and "does not match the original" in job.error
    assert job.fused_digest is None  # a model that failed its check is never handed out
    report = json.loads(env.store.read_bytes(job.report_digest))
    assert report["check"]["passed"] is False and report["check"]["failure"] == "mismatch"
    assert report["output"] is None and set(job.summary["artifacts"]) == {
        "report.html",
        "report.md",
    }
    job = env.job(kept)
    assert job.fused_digest is not None and "kept (keep_failed)" in job.error
    env.store.fetch(job.fused_digest, tmp_path / "kept.onnx")
    assert "BatchNormalization" not in op_types(tmp_path / "kept.onnx")


def test_a_measured_job_reads_the_verdict_store_not_a_shared_folder(env: WorkerEnv) -> None:
    config = {"target": "onnxruntime", "selection": "measured", "measure_options": {"budget_s": 1}}
    first, second = env.submit(config=config), env.submit(config=config)
    for job_id in (first, second):
        assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    reports = [json.loads(env.store.read_bytes(env.job(j).report_digest)) for j in (first, second)]
    options = reports[0]["config"]["measure_options"]
    assert options["cache_dir"] is None and options["verdicts_file"].endswith("verdicts.json")
    assert not (env.settings.data_dir / "measured").exists()
    groups = reports[0]["measurement"]["groups"]
    # the second job on the same model: every group decided from the first one's verdicts
    # (tests/worker/test_verdicts_flow.py follows them)
    assert groups and reports[1]["measurement"]["store"]["matched"] == len(groups)
    summary = env.job(second).summary  # unprofiled, yet with a verdict: the final comparison
    assert summary["speed"]["verdict"] == reports[1]["measurement"]["final"]["verdict"]


def test_a_measurement_budget_beyond_the_job_time_limit_fails_the_job(env: WorkerEnv) -> None:
    budget = env.settings.job_time_limit_s
    job_id = env.submit(config={"selection": "measured", "measure_options": {"budget_s": budget}})
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.failed
    job = env.job(job_id)
    assert job.attempts == 1 and "at most half the job time limit" in job.error
