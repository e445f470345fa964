"""The job row's summary (``worker.plan.summarize``) from real reports, read back through
the job resource's schema (``app.core.job_records.JobSummary``)."""

from __future__ import annotations

import json

import pytest
from report_testing import paired, real_report

from autofusion.app.api.schemas.jobs import JobSummary
from autofusion.fusion_core.report import read_report
from autofusion.worker.plan import Plan, summarize
from autofusion.worker.snapshots import CompiledSnapshot

PLAN = Plan(CompiledSnapshot(7, [], [], skipped={"old.pattern": "gone"}), {}, None)


@pytest.mark.parametrize(
    "options",
    [
        pytest.param({}, id="unprofiled"),
        pytest.param({"profile": True}, id="profiled"),
        pytest.param({"paired": paired("slower")}, id="slower"),
        pytest.param({"check": {"rtol": 0, "atol": 0}, "strict": True}, id="check-failed"),
        pytest.param({"check": {"rtol": 0, "atol": 0}}, id="fell-back"),
        pytest.param({"check": {"enabled": False}}, id="unchecked"),
    ],
)
def test_the_summary_holds_what_the_reader_reads(tmp_path, options):
    report = real_report(tmp_path, **options)
    facts = read_report(report)
    summary = summarize(report, PLAN, attempts=2, seconds=1.23456)
    json.dumps(summary, allow_nan=False)  # a JSON column takes it as is
    assert summary["target"] == facts.target
    assert summary["fusions"] == facts.fusions == sum(summary["counts"].values())
    assert summary["nodes"] == {"before": facts.nodes_before, "after": facts.nodes_after}
    assert summary["registry_version"] == 7 and summary["attempts"] == 2
    assert summary["timings"]["sandbox"] == 1.235
    assert summary["skipped_patterns"] == ["old.pattern"]
    if facts.check_passed is None:
        assert summary["check"] is None
    else:
        assert summary["check"]["passed"] is facts.check_passed
        assert summary["check"]["max_abs_diff"] == facts.max_abs_diff
        assert summary["check"]["failure"] == facts.check_failure
        assert summary["check"]["reason"] == facts.check_reason
    if facts.fallback_reason is None:
        assert "fallback" not in summary
    else:  # zero tolerance fails the BN fold: the run fell back to what passes
        assert summary["fallback"]["reason"] == facts.fallback_reason
        assert summary["fallback"]["dropped"] == facts.fallback_dropped >= 1
        assert facts.check_passed is True
    speed = facts.speed
    if speed is None:
        assert summary["speed"] is None
    else:
        assert summary["speed"]["verdict"] == speed.verdict
        assert summary["speed"]["ratio"] == speed.ratio
        assert summary["speed"]["speedup"] == pytest.approx(1 / speed.ratio)
        assert (summary["speed"]["low"], summary["speed"]["high"]) == (speed.low, speed.high)
        assert summary["speed"]["runs"] == speed.runs and summary["speed"]["level"] == speed.level
    # The job resource's schema reads every key back, unchanged.
    typed = JobSummary.model_validate(summary)
    assert typed.model_dump(mode="json", exclude_unset=True) == summary
    assert (typed.speed is None) == (speed is None)
