"""The job page of a large model in a real browser (issue 18, "the dashboard at scale"):
``fusion_core.testing.deep_conv_net(300)``, 900 nodes and 300 fusions of three
patterns, must stay a page of a few screens, its groups showing the report's counts,
folded lists opening, charts drawn; and a live job shows its phase, the time elapsed
and, once an earlier job of its kind has finished, the time left.

Measured in docs/service.md ("The dashboard at scale"): before the grouping this page
was 31,173 px tall (every fusion's row and 50 region pictures of one pattern), 4,407 px
after it.
"""

from __future__ import annotations

import re
from pathlib import Path

import browser_support as support
import onnx
import pytest
from playwright.sync_api import Page, expect
from test_dashboard import submit, wait_for_report, write_model

from autofusion.fusion_core.testing import deep_conv_net

pytestmark = [pytest.mark.browser, pytest.mark.slow]

BLOCKS = 300
MAX_PAGE_HEIGHT_PX = 6000  # at the 1280x900 viewport; 31,173 px before the grouping


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("deep") / "deep.onnx"
    onnx.save(deep_conv_net(BLOCKS), path)
    return path


def _report(page: Page, job_id: str) -> dict:
    response = page.request.get(f"/ui/jobs/{job_id}/download/report")
    assert response.ok, response.status
    return response.json()


def test_a_large_models_page_stays_short_grouped_and_folded(page: Page, deep_model: Path):
    job_id = submit(page, deep_model, model_name="deep conv net", profile=True)
    wait_for_report(page)
    report = _report(page, job_id)
    assert len(report["applied"]) == BLOCKS

    height = page.evaluate("document.body.scrollHeight")
    print(f"\njob page of {BLOCKS} fusions: document.body.scrollHeight = {height} px")
    assert height < MAX_PAGE_HEIGHT_PX, height

    # One group per pattern, with the report's counts, in the table and in the groups.
    groups = page.locator("details.fusion-group")
    shown = {
        g.get_attribute("data-pattern"): int(g.locator("summary .count").inner_text())
        for g in groups.all()
    }
    assert shown == report["fusions"]
    rows = page.locator("table#fusions tbody tr")
    table = {
        r.get_attribute("data-pattern"): int(r.locator("td.count").inner_text()) for r in rows.all()
    }
    assert table == report["fusions"]

    # The list of every fusion is folded: opening it shows the rows, and the page grows.
    biggest = groups.first
    listing = biggest.locator("details.fusion-list")
    first_row = listing.locator("tbody tr").first
    expect(first_row).to_be_hidden()
    listing.locator("summary").click()
    expect(first_row).to_be_visible()
    count = shown[biggest.get_attribute("data-pattern")]
    expect(listing.locator("tbody tr")).to_have_count(count)
    assert page.evaluate("document.body.scrollHeight") > height
    # A whole group folds away too.
    biggest.locator(":scope > summary").click()
    expect(biggest.locator("figure.region").first).to_be_hidden()

    # The pictures and the charts are drawn: boxes with shapes, histogram, slowest nodes.
    region = groups.nth(1).locator("figure.region svg").first  # the 2nd group's example
    expect(region).to_be_visible()
    expect(region.locator("text.shape").first).to_contain_text("1×4×8×8")
    for chart in ("#error-histograms svg", "#chart-slowest-original", "#chart-slowest-fused"):
        expect(page.locator(chart).first).to_be_visible()
        box = page.locator(chart).first.bounding_box()
        assert box and box["width"] > 100 and box["height"] > 50, (chart, box)
    expect(page.locator("#job-phases svg.timeline")).to_be_visible()
    expect(page.locator("a#download-original")).to_be_visible()
    expect(page.locator("#graph-viewer")).to_contain_text("Netron")


def test_a_live_job_shows_its_phase_elapsed_time_and_time_left(page: Page, tmp_path: Path):
    # An earlier profiled job of this tenant to estimate from (another test may have
    # made one already: then this one is the second).
    submit(page, write_model(tmp_path, "first.onnx", seed=7), model_name="first", profile=True)
    wait_for_report(page)

    submit(page, write_model(tmp_path, "second.onnx", seed=8), model_name="second", profile=True)
    expect(page.locator("#job-elapsed")).to_have_text(re.compile(r"elapsed \d"))
    expect(page.locator("#job-stage-label")).not_to_be_empty()
    expect(page.locator("#job-remaining")).to_have_text(
        re.compile(r"about .+ left"), timeout=support.JOB_TIMEOUT_MS
    )
    expect(page.locator("#job-estimate-note")).to_contain_text("earlier job")
    expect(page.locator("#job-phases .phase").first).to_have_attribute("data-stage", "starting")
    wait_for_report(page)
    expect(page.locator("#job-took")).to_have_text(re.compile(r"took \d"))
