"""The job page of a large model (issue 18, "the dashboard at scale"): fusions grouped by
pattern with the report's counts, a few pictured examples and the rest folded, near
misses grouped by reason; and the live section's phase, elapsed time and estimate.

The large model is ``fusion_core.testing.deep_conv_net``: three patterns fused many
times, a near miss of a fourth at every residual block. Its page's height in a real
browser is checked in tests/browser/test_dashboard_scale.py.
"""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from ui_testing import assert_page, multipart, run_job

from autofusion.app.core.models import JobStatus, utcnow
from autofusion.app.services.job_phases import PastJob, Span, next_phases, phase_spans
from autofusion.app.ui.progress import estimate_remaining, fmt_seconds, job_kind
from autofusion.fusion_core.report import (
    EXAMPLES_PER_PATTERN,
    EXAMPLES_SHOWN,
    OPEN_GROUPS,
    reason_template,
)
from autofusion.fusion_core.testing import deep_conv_net

BLOCKS = 60
GROUP = re.compile(
    r'<details class="fusion-group" id="(group-\d+)" data-pattern="([^"]+)" '
    r'data-count="(\d+)"( open)?>(.*?)\n  </details>',
    re.S,
)


@pytest.fixture
def large_job(service):
    form = multipart(deep_conv_net(BLOCKS).SerializeToString(), "deep.onnx")
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    job = run_job(service, response.headers["location"].removeprefix("/ui/jobs/"))
    html = assert_page(service.client.get(f"/ui/jobs/{job.id}"), "fusions", "regions")
    report = service.client.get(f"/v1/jobs/{job.id}/report").json()
    return html, report


def test_fusions_are_grouped_by_pattern_with_the_reports_counts(large_job):
    html, report = large_job
    groups = GROUP.findall(html)
    assert {pattern: int(count) for _, pattern, count, _, _ in groups} == report["fusions"]
    counts = [int(count) for _, _, count, _, _ in groups]
    assert counts == sorted(counts, reverse=True)  # most fusions first
    assert sum(counts) == len(report["applied"]) and len(report["applied"]) > 50
    for rank, (_, _pattern, count, is_open, body) in enumerate(groups):
        assert bool(is_open) == (rank < OPEN_GROUPS)
        # A few pictured examples, one open and the others folded ...
        shown, _, folded = body.partition('<details class="more-examples">')
        assert shown.count('<figure class="region"') == EXAMPLES_SHOWN
        assert folded.count('<figure class="region"') == EXAMPLES_PER_PATTERN - EXAMPLES_SHOWN
        # ... and every fusion of the pattern, folded, by its nodes in both models.
        listed = body.split('<details class="fusion-list"')[1]
        assert listed.count('<tr id="fusion-') == int(count)
    first = report["applied"][0]
    row = re.search(r'<tr id="fusion-0">.*?</tr>', html, re.S).group(0)
    assert all(f"<code>{name}</code>" in row for name in first["replaced_nodes"])
    assert all(f"<code>{name}</code>" in row for name in first["new_nodes"])


def test_pictures_are_a_few_per_pattern_with_shapes_and_attributes(large_job):
    html, report = large_job
    pictures = html.count('<svg xmlns="http://www.w3.org/2000/svg" class="region"')
    assert pictures == 2 * EXAMPLES_PER_PATTERN * len(report["fusions"])  # before and after
    regions = html[html.index('id="regions"') :]
    assert ">1×4×8×8<" in regions  # a tensor's shape on an edge
    assert ">p=1<" in regions  # a Conv's pads


def test_near_misses_are_grouped_by_reason(large_job):
    html, report = large_job
    table = re.search(r'<table id="near-misses">.*?</table>', html, re.S).group(0)
    rows = re.findall(r'<tr data-pattern="([^"]+)" data-count="(\d+)">', table)
    misses = report["near_misses"]
    assert rows == [("conv_add", str(len(misses)))]
    assert f"Near misses ({len(misses)} in 1 group)" in html
    assert "op.in1 (&#39;…&#39;) is not a constant initializer" in table
    assert '<details class="near-miss-rest"><summary>' in table


def test_a_reason_template_sets_the_names_aside():
    reason = "op.in1 ('block4_y') is not a constant initializer"
    assert reason_template(reason) == "op.in1 ('…') is not a constant initializer"
    assert reason_template('W "w.0" has 2 consumers') == "W '…' has 2 consumers"


def _spans(start, stages: list[tuple[str, float]], *, ended: bool) -> list[Span]:
    spans, at = [], start
    for k, (stage, seconds) in enumerate(stages):
        last = k == len(stages) - 1
        spans.append(
            Span(stage, at, None if last and not ended else at + timedelta(seconds=seconds))
        )
        at += timedelta(seconds=seconds)
    return spans


PAST = [
    ("starting", 0.1),
    ("fetching", 0.1),
    ("prepasses", 4.0),
    ("saving", 0.2),
    ("profiling", 10.0),
    ("report", 1.0),
]


def test_the_estimate_scales_earlier_jobs_by_the_phases_done():
    start = utcnow() - timedelta(seconds=100)
    past = [PastJob({"profile": True}, _spans(start - timedelta(hours=1), PAST, ended=True))]
    # This job took twice as long to optimize: profiling is likely to take twice as long.
    now_stages = [
        ("starting", 0.2),
        ("fetching", 0.2),
        ("prepasses", 8.0),
        ("saving", 0.4),
        ("profiling", 5.0),
    ]
    spans = _spans(start, now_stages, ended=False)
    now = spans[-1].start + timedelta(seconds=5.0)
    estimate = estimate_remaining(spans, now, past)
    assert estimate.scaled and not estimate.overdue and estimate.jobs == 1
    assert estimate.seconds == pytest.approx(2 * 10.0 - 5.0 + 2 * 1.0, rel=0.02)
    # Past what was expected: the rest only, and said so.
    late = estimate_remaining(spans, spans[-1].start + timedelta(seconds=30), past)
    assert late.overdue and late.seconds == pytest.approx(2.0, rel=0.02)
    # Nothing done worth a second elsewhere: the medians as they are.
    early = _spans(start, [("starting", 0.1), ("fetching", 0.1), ("prepasses", 1.0)], ended=False)
    plain = estimate_remaining(early, early[-1].start + timedelta(seconds=1), past)
    assert not plain.scaled and plain.seconds == pytest.approx(3.0 + 0.2 + 10.0 + 1.0, rel=0.02)
    assert estimate_remaining(spans, now, []) is None


def test_phases_are_appended_once_per_stage_and_read_per_attempt():
    now = utcnow()
    phases = [{"stage": "starting", "at": now.isoformat()}]
    assert next_phases(phases, "starting", now) is None  # a heartbeat: nothing new
    later = next_phases(phases, "fetching", now + timedelta(seconds=2))
    assert [p["stage"] for p in later] == ["starting", "fetching"]
    spans = phase_spans(later, now, now + timedelta(seconds=5))
    assert [(s.stage, s.seconds(now)) for s in spans] == [("starting", 2.0), ("fetching", 3.0)]
    # A retried attempt started after these: they are not its phases.
    assert phase_spans(later, now + timedelta(seconds=10), None) == []
    assert phase_spans([{"stage": 3}, "x", None], now, None) == []


def test_seconds_read_as_people_write_them():
    assert [fmt_seconds(s) for s in (0.42, 12.4, 185, 3725)] == [
        "0.4 s", "12 s", "3 min 05 s", "1 h 02 min",
    ]  # fmt: skip


def test_the_live_section_shows_phase_elapsed_time_and_the_estimate(
    service, tiny_model, monkeypatch
):
    now = utcnow()
    monkeypatch.setattr(
        "autofusion.app.ui.jobs.utcnow", lambda: now
    )  # the page's clock, held still
    start = now - timedelta(seconds=120)
    done, running = (
        service.submit(tiny_model, config={"profile": True}).json()["id"] for _ in range(2)
    )
    past = _spans(start - timedelta(hours=1), PAST, ended=True)
    service.update_job(
        done,
        status=JobStatus.succeeded.value,
        stage="succeeded",
        started_at=past[0].start,
        finished_at=past[-1].end,
        phases=[{"stage": s.stage, "at": s.start.isoformat()} for s in past],
    )
    spans = _spans(now - timedelta(seconds=9.4), PAST[:5], ended=False)
    service.update_job(
        running,
        status=JobStatus.running.value,
        stage="profiling",
        progress=0.82,
        started_at=spans[0].start,
        phases=[{"stage": s.stage, "at": s.start.isoformat()} for s in spans],
    )
    html = assert_page(
        service.client.get(f"/ui/jobs/{running}/live"),
        "live", "job-stage", "job-stage-label", "job-elapsed", "job-in-phase", "job-remaining",
        "job-phases",
    )  # fmt: skip
    assert 'data-stage="profiling"' in html and "timing both models in onnxruntime" in html
    assert 'id="job-elapsed">elapsed 9.4 s<' in html
    assert 'id="job-in-phase">5.0 s<' in html  # profiling began after 4.4 s of the rest
    # Done phases as long as the earlier job's: its 10 s of profiling and 1 s of report.
    assert 'id="job-remaining">about 6.0 s left<' in html
    assert "from 1 earlier job(s) of this kind, scaled by this job" in html
    # A job of another kind (not profiled) has nothing to go by.
    other = service.submit(tiny_model, config={"profile": False}).json()["id"]
    service.update_job(other, status="running", stage="prepasses", started_at=now, phases=[])
    page = service.client.get(f"/ui/jobs/{other}/live").text
    assert 'id="job-remaining"' not in page and "no estimate yet" in page


def test_a_failed_job_shows_its_problem_type_title_and_detail(service, tiny_model):
    job_id = service.submit(tiny_model).json()["id"]
    detail = "the fused model does not match the original; see the report"
    service.update_job(
        job_id, status="failed", stage="failed", error=detail, error_type="check-failed"
    )
    html = assert_page(service.client.get(f"/ui/jobs/{job_id}"), "job-error", "job-problem")
    section = html[html.index('id="job-error"') :].split("</section>")[0]
    assert 'data-type="check-failed"' in section
    assert "The fused model failed its numerical check" in section  # the problem's title
    assert f'<p class="detail">{detail}</p>' in section
    # The type as text: a page of the dashboard links nothing on another host.
    assert '<code id="job-problem">https://autofusion.dev/problems/check-failed</code>' in section


def test_many_kinds_of_near_miss_fold_beyond_the_first_groups():
    from autofusion.app.ui.common import templates
    from autofusion.app.ui.report_view import report_view

    misses = [
        {"pattern": f"p{k}", "nodes": [f"n{k}_{j}"], "reason": f"reason {k}", "kind": "constraint"}
        for k in range(40)
        for j in range(40 - k)  # p0 most often, p39 once
    ]
    report = {"applied": [], "near_misses": misses, "check": None, "profile": None}
    html = templates.get_template("_report.html").render(report=report_view(report))
    table, _, folded = html.partition('<details id="near-misses-more">')
    assert table.count("<tr data-pattern=") == 15 and 'data-pattern="p0" data-count="40"' in table
    assert folded.count("<tr data-pattern=") == 25 and 'data-pattern="p39" data-count="1"' in folded


@pytest.mark.parametrize(
    ("config", "kind"),
    [
        ({}, (False, False)),
        ({"profile": True}, (True, False)),
        ({"measure": True}, (False, True)),
        ({"selection": "measured", "profile": True}, (True, True)),
        ({"progressive": True}, (False, False)),
        ({"selection": "no-such-strategy"}, (False, False)),  # an older row: plain
        (None, (False, False)),
    ],
)
def test_a_jobs_kind_is_the_configs_mode(config, kind) -> None:
    """The estimate compares a job with earlier ones of its kind; measured is what the
    config's one mode decision says (``OptimizeConfig.mode``), not a second reading."""
    assert job_kind(config) == kind
