"""One stylesheet for the report: fusion_core's report.css, inlined whole in the
standalone report.html (self-contained) and linked by every dashboard page; the
dashboard's style.css holds only its own chrome and repeats none of it."""

from __future__ import annotations

import re
from pathlib import Path

from ui_testing import assert_page, conv_bn_relu, multipart, run_job

from autofusion.app import ui
from autofusion.fusion_core.report import REPORT_STYLESHEET, render_html

DASHBOARD_SHEET = Path(ui.__file__).resolve().parent / "static" / "style.css"
# An old copy scoped its rules under the report's section (its variables on #report
# itself): read them as the rule itself.
_SCOPE = re.compile(r"#report\s+")


def _declarations(css: str) -> set[tuple[str, str]]:
    """Every (selector, property) a sheet sets."""
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    found = set()
    for selectors, body in re.findall(r"([^{}]+)\{([^}]*)\}", css):
        names = [_SCOPE.sub("", s.strip() + " ").strip() or ":root" for s in selectors.split(",")]
        props = [d.split(":", 1)[0].strip() for d in body.split(";") if ":" in d]
        found |= {(name, prop) for name in names for prop in props}
    return found


def test_the_dashboard_sheet_repeats_none_of_the_report_sheet():
    shared = _declarations(REPORT_STYLESHEET.read_text(encoding="utf-8"))
    own = _declarations(DASHBOARD_SHEET.read_text(encoding="utf-8"))
    assert shared, "the report sheet sets nothing"
    assert not shared & own, sorted(shared & own)


def test_the_standalone_report_inlines_the_whole_sheet_and_links_nothing():
    html = render_html({"model": "m.onnx", "target": "generic", "nodes": {}})
    sheet = REPORT_STYLESHEET.read_text(encoding="utf-8")
    assert sheet.strip() in html
    assert html.count("<style>") == 1 and "<link" not in html


def test_every_dashboard_page_links_the_report_sheet_before_its_own(service):
    css = service.client.get("/ui/report.css")
    assert css.status_code == 200 and css.headers["content-type"].startswith("text/css")
    assert css.text == REPORT_STYLESHEET.read_text(encoding="utf-8")
    html = service.client.get("/ui/jobs").text
    shared = html.index('<link rel="stylesheet" href="/ui/report.css">')
    assert shared < html.index('<link rel="stylesheet" href="/ui/static/style.css">')


def test_the_job_page_shows_the_report_without_a_second_copy_of_the_sheet(service):
    form = multipart(conv_bn_relu().SerializeToString(), "net.onnx")
    response = service.client.post("/ui/submit", **form, follow_redirects=False)
    job = run_job(service, response.headers["location"].removeprefix("/ui/jobs/"))
    html = assert_page(service.client.get(f"/ui/jobs/{job.id}"), "report", "summary")
    assert "<style>" not in html  # the linked sheet styles the report section
