"""The worker refuses a job whose predicted memory cannot fit the sandbox's limit
(``worker/memory_plan.py``, issue 29) before any sandbox starts, and runs one that fits,
whose report then carries the optimization's own peak and the prediction."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import JOB_PROBLEMS, job_problem
from autofusion.fusion_core import OptimizeConfig, predict_peak_bytes
from autofusion.fusion_core.report import bytes_text
from autofusion.worker import sandbox
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.memory_plan import MEMORY_PROBLEM, JobMemoryError, check_memory
from tests.worker.worker_testing import RESNET, WorkerEnv

GIB = 1 << 30


def test_a_job_that_cannot_fit_fails_before_its_sandbox_starts(make_env, monkeypatch) -> None:
    # 64 MB: less than the interpreter and onnxruntime alone, whatever the config
    env: WorkerEnv = make_env(job_memory_limit_mb=64)
    started = []
    monkeypatch.setattr("autofusion.worker.execute.run_child", lambda *a, **k: started.append(1))
    job_id = env.submit(max_attempts=3)
    start = time.monotonic()
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.failed
    assert time.monotonic() - start < 10 and not started  # no sandbox ran
    job = env.job(job_id)
    assert (job.status, job.attempts, job.error_type) == ("failed", 1, MEMORY_PROBLEM)
    assert job.attempt_log is None  # no crash: no attempt spent on dying
    size = bytes_text(RESNET.stat().st_size)
    assert job.error.startswith(f"this model ({size} with its data) needs about ")
    assert "to optimize with the check on; this server's limit is 64.0 MiB" in job.error
    assert "even with the check off" in job.error
    assert "AUTOFUSION_JOB_MEMORY_LIMIT_MB" in job.error
    assert not (env.settings.jobs_dir / job_id).exists()  # the fetched model is gone too
    error = job_problem(job.error_type, job.error)  # the API's problem object
    assert error["type"].endswith("/memory-predicted")
    assert error["title"] == JOB_PROBLEMS[MEMORY_PROBLEM]


def test_a_job_that_fits_runs_and_its_report_has_the_peak_and_the_prediction(
    env: WorkerEnv,
) -> None:
    job_id = env.submit()
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    report = json.loads(env.store.read_bytes(env.job(job_id).report_digest))
    own = report["optimize_memory"]
    assert own["model_bytes"] == RESNET.stat().st_size
    predicted = predict_peak_bytes(RESNET.stat().st_size, OptimizeConfig())
    assert own["predicted_peak_bytes"] == predicted < env.settings.job_memory_limit_mb << 20
    # the sandbox's own peak: the interpreter and onnxruntime at least, under the limit
    assert 64 << 20 < own["peak_rss_bytes"] < env.settings.job_memory_limit_mb << 20
    assert list(own["by_phase"]) == ["load", "prepasses", "fuse", "check", "saving"]


def _inputs(tmp_path: Path, size: int) -> Path:
    """An inputs folder with a model of ``size`` bytes: a sparse file, nothing written."""
    folder = tmp_path / sandbox.INPUT_DIR
    folder.mkdir()
    (folder / "model.onnx").write_bytes(b"x" * 1000)
    with open(folder / "model.onnx.data", "wb") as data:
        data.truncate(size - 1000)
    return folder


def _limit_mb(size: int, config: OptimizeConfig) -> int:
    return -(-predict_peak_bytes(size, config) // (1 << 20))


def test_the_refusal_says_what_would_fit(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, 4 * GIB)
    # the limit fits the job with the check off, not with it on (by far more than 25%)
    limit = _limit_mb(4 * GIB, OptimizeConfig.model_validate({"check": {"enabled": False}}))
    settings = Settings(data_dir=tmp_path, job_memory_limit_mb=limit)
    with pytest.raises(JobMemoryError) as refused:
        check_memory(settings, {"profile": True}, inputs)
    message = str(refused.value)
    assert message.startswith("this model (4.00 GiB with its data) needs about ")
    assert "to optimize with the check on and profiling; this server's limit is " in message
    assert "turn the check off (check.enabled=false), leave profiling off" in message
    assert message.endswith("or ask the operator to raise AUTOFUSION_JOB_MEMORY_LIMIT_MB")
    assert refused.value.problem == MEMORY_PROBLEM


def test_the_refusal_keeps_the_check_when_that_fits(tmp_path: Path) -> None:
    """Below 2 GB a job's fused model is one file: saving it costs more than the check,
    so leaving profiling off is enough and the check stays on."""
    inputs = _inputs(tmp_path, 3 * GIB // 2)
    limit = _limit_mb(3 * GIB // 2, OptimizeConfig())  # the job without profiling fits
    settings = Settings(data_dir=tmp_path, job_memory_limit_mb=limit)
    with pytest.raises(JobMemoryError) as refused:
        check_memory(settings, {"profile": True}, inputs)
    message = str(refused.value)
    assert "with the check on and profiling" in message
    assert ": leave profiling off (profile=false), which needs about " in message
    assert "turn the check off" not in message


def test_the_margin_and_the_switch(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, GIB)
    needs = predict_peak_bytes(GIB, OptimizeConfig())
    # a prediction over the limit, but within the margin, runs: the prediction errs high
    under = int(needs / 1.2) >> 20
    settings = Settings(data_dir=tmp_path, job_memory_limit_mb=under)
    assert check_memory(settings, {}, inputs) == needs
    tight = Settings(data_dir=tmp_path, job_memory_limit_mb=under, job_memory_prediction_margin=0)
    with pytest.raises(JobMemoryError):
        check_memory(tight, {}, inputs)
    off = Settings(data_dir=tmp_path, job_memory_limit_mb=64, job_memory_prediction=False)
    assert check_memory(off, {}, inputs) is None


def test_a_job_with_data_files_is_predicted_as_it_will_be_saved(tmp_path: Path) -> None:
    """A job whose weights came in a data file is saved with one (``worker/sandbox.py``);
    profiled, the same bytes in one file are predicted lower (fusion_core's memory
    multiples: a data file's profiling keeps more room, as it reaches past 2 GB): a limit
    between the two refuses only the data-file job."""
    inputs = _inputs(tmp_path, GIB)
    profiled = {"profile": True}
    config = OptimizeConfig.model_validate(profiled)
    with_data = predict_peak_bytes(GIB, config, external_data=True)
    one_file = predict_peak_bytes(GIB, config)
    assert one_file < with_data
    limit = (with_data + one_file) // 2 >> 20
    settings = Settings(
        data_dir=tmp_path, job_memory_limit_mb=limit, job_memory_prediction_margin=0
    )
    assert check_memory(settings, profiled, inputs) == one_file
    with pytest.raises(JobMemoryError):
        check_memory(settings, profiled, inputs, external_data=True)
