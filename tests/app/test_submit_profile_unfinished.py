"""``autofusion submit`` on a job whose profiling ran out of time (issue 27): the job
succeeded with its checked model, the summary says the speed is unknown and why, and a
``--min-speedup`` gate does not pass on an unknown speed."""

from __future__ import annotations

import json
from types import SimpleNamespace

import onnx
import pytest

from autofusion.app.cli._submit_output import evaluate_gates, facts
from autofusion.fusion_core import OptimizeConfig, RunFiles, run
from autofusion.fusion_core.testing import conv_bn_relu
from autofusion.worker.attempts import profile_unfinished_message


class _Stopped(Exception):
    pass


def _stop_at_profiling(stage: str, _progress: float) -> None:
    if stage == "profiling":
        raise _Stopped  # where the worker's time limit stopped the sandbox


@pytest.fixture(scope="module")
def unfinished(tmp_path_factory) -> dict:
    """The report a sandbox stopped while profiling leaves: written by ``run`` itself."""
    folder = tmp_path_factory.mktemp("unfinished")
    onnx.save(conv_bn_relu(), folder / "in.onnx")
    with pytest.raises(_Stopped):
        run(
            folder / "in.onnx", folder / "fused.onnx", OptimizeConfig(profile=True),
            files=RunFiles(report=folder / "report.json"), on_stage=_stop_at_profiling,
        )  # fmt: skip
    return json.loads((folder / "report.json").read_text())


def test_an_unknown_speed_fails_the_speed_gate_and_says_why(unfinished) -> None:
    gates = evaluate_gates(unfinished, None, 1.0, profiled=True)
    assert {g.name: g.passed for g in gates} == {"check": True, "min-speedup": False}
    assert gates[-1].message.startswith("profiling did not finish")
    assert "no speedup to gate on" in gates[-1].message


def test_the_summary_says_the_speed_is_unknown_and_what_to_do(unfinished) -> None:
    warning = profile_unfinished_message(900, checked=True)
    job = {
        "id": "j1",
        "status": "succeeded",
        "summary": {"profile_error": warning},
        "links": {"model": "/v1/jobs/j1/model", "report": "/v1/jobs/j1/report"},
    }
    outcome = SimpleNamespace(
        job=job, report=unfinished, profiled=True, elapsed_s=1.0, gates=[],
        url="http://x/v1/jobs/j1", server="http://x",
    )  # fmt: skip
    shown = dict(facts(outcome))
    assert shown["speedup"].startswith("UNKNOWN: profiling did not finish")
    assert shown["warning"] == warning and "job_time_limit_s" in warning
    assert shown["check"].startswith("passed")
