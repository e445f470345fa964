"""A time limit reached while profiling is a time limit, not a crash, and costs nothing
that was done (issue 27): the fused model was saved and checked before profiling, so the
job succeeds with it and a report whose profile says it did not finish; the summary's
``profile_error`` says why the speed is unknown and what to do."""

from __future__ import annotations

import json

import onnx
import pytest

from autofusion.app.core.errors import job_problem
from autofusion.fusion_core import testing
from autofusion.fusion_core.pipeline import PROFILE_UNFINISHED
from autofusion.worker.attempts import repeated_problem
from autofusion.worker.execute import Outcome, execute_job
from autofusion.worker.sandbox import TEST_CRASH_ENV

# Enough for the sandbox to start, fuse and check the small model before profiling.
LIMIT_S = 12


def _model() -> bytes:
    return testing.conv_bn_relu(
        in_channels=2, out_channels=3, height=4, width=4
    ).SerializeToString()


@pytest.mark.parametrize(
    ("crash", "config", "words"),
    [
        pytest.param("profiling:sleep:120", {"profile": True}, "passed its check", id="waiting"),
        pytest.param(
            "profiling:spin:120",
            {"profile": True, "check": {"enabled": False}},
            "is kept (its check was skipped)",
            id="computing-unchecked",
        ),
    ],
)
def test_a_job_out_of_time_while_profiling_keeps_its_checked_model(
    make_env, monkeypatch, tmp_path, crash: str, config: dict, words: str
) -> None:
    env = make_env(job_time_limit_s=LIMIT_S)
    monkeypatch.setenv(TEST_CRASH_ENV, crash)
    job_id = env.submit(_model(), config=config, model_name="cbr.onnx", max_attempts=3)
    assert execute_job(env.settings, job_id, "w1", env.store) == Outcome.succeeded
    job = env.job(job_id)
    assert (job.status, job.attempts, job.error, job.error_type) == ("succeeded", 1, None, None)
    summary = job.summary
    assert summary["profile_error"].startswith(
        f"Profiling did not finish within the time limit of {LIMIT_S} s: the fused model {words}"
    )
    assert "AUTOFUSION_JOB_TIME_LIMIT_S" in summary["profile_error"]
    assert '"profile": false' in summary["profile_error"]
    assert summary["speed"] is None and summary["fusions"] >= 1
    assert "profile_trace.json" not in summary["artifacts"]
    report = json.loads(env.store.read_bytes(job.report_digest))
    assert report["profile"] == {"error": PROFILE_UNFINISHED} and report["memory"] is None
    assert report["output"] == "cbr.fused.onnx"
    if config.get("check", {}).get("enabled", True):
        assert report["check"]["passed"] is True
    env.store.fetch(job.fused_digest, tmp_path / "fused.onnx")
    fused = onnx.load(tmp_path / "fused.onnx")
    assert "BatchNormalization" not in {n.op_type for n in fused.graph.node}
    assert report["digests"]["output_sha256"] == job.fused_digest


def test_only_a_signal_seen_twice_is_titled_a_crash() -> None:
    assert repeated_problem("signal:11", "crashed") == "crashed-twice"
    assert repeated_problem("timeout", "profile-time-limit") == "profile-time-limit"
    assert repeated_problem("memory", "memory-limit") == "memory-limit"
    title = job_problem("profile-time-limit", "...")["title"]
    assert title == "Profiling did not finish within the time limit"


@pytest.mark.parametrize(
    ("profile", "check", "fused", "expected"),
    [
        pytest.param({"error": PROFILE_UNFINISHED}, {"passed": True}, True, True, id="checked"),
        pytest.param({"error": PROFILE_UNFINISHED}, None, True, False, id="check-skipped"),
        pytest.param({"error": PROFILE_UNFINISHED}, {"passed": False}, True, None, id="failed"),
        pytest.param({"error": PROFILE_UNFINISHED}, {"passed": True}, False, None, id="no-model"),
        pytest.param({"latency": []}, {"passed": True}, True, None, id="profiled"),
        pytest.param(None, {"passed": True}, True, None, id="not-profiling"),
    ],
)
def test_only_a_saved_model_with_the_unfinished_report_is_kept(
    tmp_path, profile, check, fused: bool, expected
) -> None:
    from autofusion.worker.execute import _unfinished_profile

    report = {"profile": profile, "check": check}
    (tmp_path / "report.json").write_text(json.dumps(report))
    if fused:
        (tmp_path / "m.fused.onnx").write_bytes(b"model")
    assert _unfinished_profile(tmp_path, "m.fused.onnx") is expected


def test_a_report_cut_off_while_written_keeps_nothing(tmp_path) -> None:
    from autofusion.worker.execute import _unfinished_profile

    (tmp_path / "m.fused.onnx").write_bytes(b"model")
    (tmp_path / "report.json").write_text('{"profile": {"error": "profiling did')
    assert _unfinished_profile(tmp_path, "m.fused.onnx") is None
