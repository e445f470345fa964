"""The worker applies the rules (issue 28, item 3): a pattern disabled on the machine
class a job runs on here is left out of it (measured or not) and its summary says why;
a pattern disabled on another class is not."""

from __future__ import annotations

import pytest
from report_testing import real_report
from ui_testing import assert_page, conv_bn_relu, run_job
from verdict_rows import SLOWER, record, store

from autofusion.app.core.models import Job
from autofusion.app.services import pattern_class_rules as class_rules
from autofusion.fusion_core.profiling.verdicts import machine_key, measuring_machine
from autofusion.worker.plan import plan_job, summarize
from autofusion.worker.snapshots import SnapshotCache

# This host's classes at one and at two threads (what the worker computes at plan time).
ONE, TWO = measuring_machine("ORT_ENABLE_ALL", 1), measuring_machine("ORT_ENABLE_ALL", 2)


@pytest.fixture
def ruled(service):
    """conv_bn_relu disabled on this host at one thread, conv_bn at two threads."""
    with service.db() as session:
        store(
            session,
            [record(SLOWER, job="j1", on=ONE), record(SLOWER, job="j2", pattern="conv_bn", on=TWO)],
        )
        class_rules.disable_on_class(
            session, "conv_bn_relu", machine_key(ONE), by="key:7", reason="slower here"
        )
        class_rules.disable_on_class(
            session, "conv_bn", machine_key(TWO), by="auto", reason="slower at 2 threads"
        )
    return service


def _plan(service, config: dict):
    with service.db() as session:
        return plan_job(
            session, Job(config=config, registry_version=None, strategy=None), SnapshotCache()
        )


def test_the_plan_leaves_out_what_is_disabled_on_its_class_only(ruled) -> None:
    plan = _plan(ruled, {})
    assert "conv_bn_relu" in plan.config["exclude"] and "conv_bn" not in plan.config["exclude"]
    assert plan.disabled_on_class["machine_key"] == machine_key(ONE)
    assert list(plan.disabled_on_class["patterns"]) == ["conv_bn_relu"]
    why = plan.disabled_on_class["patterns"]["conv_bn_relu"]
    assert "by key:7" in why and "slower here" in why and "/v1/verdicts?pattern=conv_bn_relu" in why

    at_two = _plan(ruled, {"selection": "measured", "measure_options": {"threads": 2}})
    assert "conv_bn" in at_two.config["exclude"] and "conv_bn_relu" not in at_two.config["exclude"]
    assert list(at_two.disabled_on_class["patterns"]) == ["conv_bn"]

    # A job that does not use the pattern: nothing to leave out, nothing to say.
    only = _plan(ruled, {"patterns": ["conv_bn"], "exclude": ["layer_norm"]})
    assert only.config["exclude"] == ["layer_norm"] and only.disabled_on_class is None
    with ruled.db() as session:
        class_rules.enable_on_class(session, "conv_bn_relu", machine_key(ONE))
    again = _plan(ruled, {})
    assert "conv_bn_relu" not in again.config["exclude"] and again.disabled_on_class is None


def test_the_summary_says_what_was_left_out_and_why(ruled, tmp_path) -> None:
    plan = _plan(ruled, {})
    summary = summarize(real_report(tmp_path), plan, attempts=1, seconds=1.0)
    assert summary["disabled_on_class"] == plan.disabled_on_class


def test_a_job_on_a_class_where_a_pattern_is_disabled_does_without_it(ruled) -> None:
    model = conv_bn_relu(width=8).SerializeToString()
    job_id = ruled.submit(model).json()["id"]
    job = run_job(ruled, job_id)
    assert "conv_bn_relu" not in (job.summary.get("counts") or {})
    assert list(job.summary["disabled_on_class"]["patterns"]) == ["conv_bn_relu"]
    public = ruled.client.get(f"/v1/jobs/{job_id}").json()["summary"]
    assert "slower here" in public["disabled_on_class"]["patterns"]["conv_bn_relu"]
    page = assert_page(ruled.client.get(f"/ui/jobs/{job_id}"), "disabled-on-class")
    assert 'href="/ui/patterns/conv_bn_relu#machine-classes"' in page and "slower here" in page
