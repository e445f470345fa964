"""One renderer, one verdict (issue 27): report.md, report.html and the job page of one
job state the same verdict, ratio and interval, and the report page opens in the browser
(inline, sandboxed) while its download stays a download.

The first job really runs (the worker writes report.html and report.md); the second is
the issue's case, a real report whose medians (48.8 ms against 55.5 ms) disagree with
its paired verdict (no measurable change), finished as a worker would finish it.
"""

from __future__ import annotations

import html as html_lib
import re

import pytest
from report_testing import paired, real_report
from ui_testing import conv_bn_relu, multipart, run_job

from autofusion.app.services.job_files import ARTIFACT_CSP, REPORT_PAGE_CSP
from autofusion.fusion_core.report import (
    DEPLOYMENT_LEVEL,
    format_markdown,
    read_report,
    render_html,
)


def _stated(page: str) -> dict[str, str]:
    """The verdict, ratio and interval an HTML rendering states (the shared template's)."""
    found = {
        "verdict": re.search(r'id="speed-verdict" class="[^"]+" data-verdict="([^"]+)"', page),
        "headline": re.search(r'<span class="speed-headline">([^<]+)</span>', page),
        "ratio": re.search(r'id="speed-ratio">([^<]+)<', page),
        "interval": re.search(r'id="speed-interval">([^<]+)<', page),
    }
    return {key: html_lib.unescape(m.group(1)) for key, m in found.items()}


def _markdown_speed(markdown: str) -> str:
    return next(line for line in markdown.splitlines() if line.startswith("**Speed:**"))


def _assert_one_verdict(markdown: str, report_html: str, job_page: str, report: dict) -> None:
    speed = read_report(report).speed
    stated = _stated(report_html)
    assert stated == _stated(job_page)
    assert stated["verdict"] == speed.verdict and stated["ratio"] == f"{speed.ratio:.3f}"
    assert stated["interval"].endswith(f"{speed.low:.3f}–{speed.high:.3f}")
    line = _markdown_speed(markdown)
    assert stated["headline"] in line and f"fused/original {stated['ratio']}" in line
    assert f"interval {speed.low:.3f}-{speed.high:.3f}" in line


@pytest.fixture
def finished(service):
    form = multipart(conv_bn_relu().SerializeToString(), "net.onnx", profile="on")
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    return service, run_job(service, response.headers["location"].removeprefix("/ui/jobs/"))


def test_the_three_renderings_of_a_job_state_one_verdict(finished):
    service, job = finished
    base = f"/ui/jobs/{job.id}"
    report = service.client.get(f"{base}/download/report").json()
    markdown = service.client.get(f"{base}/download/report.md").text
    report_html = service.client.get(f"{base}/report.html").text
    job_page = service.client.get(base).text
    _assert_one_verdict(markdown, report_html, job_page, report)
    assert f'href="{base}/report.html"' in job_page  # the job page links the report page
    # The worker drew the region pictures once, for report.html and for regions.json.
    pictures = [page.count('class="region" width=') for page in (report_html, job_page)]
    assert pictures[0] == pictures[1] >= 2


def test_the_report_page_opens_inline_and_sandboxed(finished):
    service, job = finished
    base = f"/ui/jobs/{job.id}"
    page = service.client.get(f"{base}/report.html")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-disposition"].startswith("inline; ")
    # Its own CSP, once: the dashboard's (which allows its scripts) is not added beside it.
    assert page.headers.get_list("content-security-policy") == [REPORT_PAGE_CSP]
    assert "sandbox" in REPORT_PAGE_CSP.split("; ") and "script-src" not in REPORT_PAGE_CSP
    assert "<script" not in page.text.lower()
    again = service.client.get(
        f"{base}/report.html", headers={"If-None-Match": page.headers["etag"]}
    )
    assert again.status_code == 304
    head = service.client.head(f"{base}/report.html")
    assert head.status_code == 200 and head.headers["content-disposition"].startswith("inline")
    # The downloads stay downloads, on the dashboard and on the API.
    for url in (f"{base}/download/report.html", f"/v1/jobs/{job.id}/artifacts/report.html"):
        download = service.client.get(url)
        assert download.headers["content-disposition"].startswith("attachment; "), url
        assert download.headers["content-security-policy"] == ARTIFACT_CSP
        assert download.content == page.content


def test_the_report_page_of_a_job_without_one_is_a_conflict(service, tiny_model):
    job_id = service.submit(tiny_model).json()["id"]
    assert service.client.get(f"/ui/jobs/{job_id}/report.html").status_code == 409


def test_medians_that_disagree_do_not_change_the_verdict(service, tmp_path):
    """The issue's job: report.html once showed the medians' 1.136 as the ratio."""
    report = real_report(tmp_path / "r", paired=paired("no measurable change"))
    for level in report["profile"]["latency"]:
        if level["level"] == DEPLOYMENT_LEVEL:
            medians = {"original": 48.8, "fused": 55.5}
            for session in level["sessions"]:
                session["median_ms"] = medians[session["label"]]
            level["ratio"] = 55.5 / 48.8
    store = service.app.state.store
    artifacts = {
        "report.html": store.put_bytes(render_html(report).encode()),
        "report.md": store.put_bytes(format_markdown(report).encode()),
    }
    job_id = service.submit(conv_bn_relu().SerializeToString()).json()["id"]
    service.succeed(job_id, b"model", report, summary={"fusions": 1, "artifacts": artifacts})
    base = f"/ui/jobs/{job_id}"
    markdown = service.client.get(f"{base}/download/report.md").text
    report_html = service.client.get(f"{base}/report.html").text
    job_page = service.client.get(base).text
    _assert_one_verdict(markdown, report_html, job_page, report)
    for text in (markdown, report_html, job_page):
        assert "the medians alone say +14% slower" in text
        assert "1.137" not in text and "1.14x" not in text
    # Each model's median is detail, folded under the one figure, on both pages.
    for page in (report_html, job_page):
        assert '<details id="speed-medians" data-differ="true">' in page
