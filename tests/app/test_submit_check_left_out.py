"""A passed check that left sizes out (the original cannot run there) says so in every
consumer: the CI client's text summary and ``--json``, and the job summary the worker
writes (``check.left_out``)."""

from __future__ import annotations

from types import SimpleNamespace

from submit_testing import submit_outcome

from autofusion.app.cli._submit_json import submit_document
from autofusion.app.cli._submit_output import facts
from autofusion.app.core.job_records import JobSummary
from autofusion.fusion_core.report import read_report

LEFT = "{'batch': 1, 'sequence': 7}: left out: the original model cannot run on these inputs"
CHECK = {"passed": True, "max_abs_diff": 1e-6, "samples": 2, "outputs": [], "skipped": [LEFT]}


def _outcome(check: dict) -> SimpleNamespace:
    return submit_outcome({"target": "onnxruntime", "fusions": {}, "nodes": {}, "check": check})


def test_the_client_says_what_the_check_left_out() -> None:
    outcome = _outcome(CHECK)
    assert dict(facts(outcome))["check"] == f"passed, max abs diff 1e-06; not checked at {LEFT}"
    assert submit_document(outcome)["check"]["left_out"] == [LEFT]
    plain = _outcome({**CHECK, "skipped": []})
    assert dict(facts(plain))["check"] == "passed, max abs diff 1e-06"
    assert submit_document(plain)["check"]["left_out"] == []


def test_the_job_summary_keeps_it_and_reads_back() -> None:
    """The summary's form (``left_out``) reads back as the report's (``skipped``)."""
    summary = JobSummary.model_validate({"check": {"passed": True, "left_out": [LEFT]}})
    assert summary.check is not None and summary.check.left_out == [LEFT]
    assert read_report({"check": summary.check.model_dump()}).check_left_out == (LEFT,)
    assert read_report({"check": CHECK}).check_left_out == (LEFT,)
