"""The job's report in a real browser (issue 27): one latency figure with its verdict and
interval, each model's median folded under it as detail; growth the speed did not pay
for flagged; and the report page, the same templates as the job page, opened in the
browser (inline, sandboxed) from the job page. Each step leaves a screenshot
(``AUTOFUSION_SCREENSHOT_DIR``, else the test's temporary folder)."""

from __future__ import annotations

import re
from pathlib import Path

import browser_support as support
import httpx
import onnx
import pytest
from playwright.sync_api import Page, expect

from autofusion.fusion_core.testing import constant_fills

pytestmark = [pytest.mark.browser, pytest.mark.slow]

JOB_URL = re.compile(r"/ui/jobs/(?P<id>[^/?#]+)$")
HEADLINE = re.compile(r"^(\d+(\.\d)?% faster|\+\d+(\.\d)?% slower|no measurable change)$")


def _finished_job(page: Page, model: Path, name: str, *, profile: bool) -> str:
    """Submit on the Submit page, wait on the job page until its report is there."""
    page.goto("/ui/submit")
    form = page.locator("form#submit-form")
    form.locator('input[type="file"][name="model"]').set_input_files(model)
    form.locator('input[name="model_name"]').fill(name)
    form.locator('select[name="target"]').select_option("generic")
    form.locator('input[name="profile"]').set_checked(profile)
    form.locator("button#submit").click()
    page.wait_for_url(JOB_URL)
    page.locator("section#report").wait_for(state="visible", timeout=support.JOB_TIMEOUT_MS)
    expect(page.locator("#job-status")).to_have_attribute("data-status", "succeeded")
    return JOB_URL.search(page.url)["id"]


@pytest.fixture
def profiled(page: Page, tmp_path: Path) -> str:
    model = tmp_path / "conv_bn_relu.onnx"
    onnx.save(support.conv_bn_relu_model(), model)
    return _finished_job(page, model, "report conv-bn-relu", profile=True)


def test_the_job_page_shows_one_latency_figure(page: Page, server, profiled: str, shot) -> None:
    speed = httpx.get(f"{server.url}/v1/jobs/{profiled}/report").json()["speed"]
    verdict = page.locator("#speed-verdict")
    expect(verdict).to_be_visible()
    expect(verdict).to_have_attribute("data-verdict", speed["verdict"])
    assert HEADLINE.match(page.locator("#speed-verdict .speed-headline").inner_text())
    expect(page.locator("#speed-ratio")).to_have_text(f"{speed['ratio']:.3f}")
    expect(page.locator("#speed-interval")).to_contain_text(
        f"{speed['low']:.3f}–{speed['high']:.3f}"
    )
    # Each model's median is detail: folded, one click away, with why it may differ.
    why = page.locator("#speed-medians p")
    expect(why).to_be_hidden()
    expect(page.locator("table#latency")).to_be_hidden()
    summary = page.locator("#summary").inner_text()
    assert "e+" not in summary and not re.search(r"µs/run -\d", summary)
    shot(page, "job-latency")
    page.locator("#speed-medians > summary").click()
    expect(why).to_be_visible()
    expect(why).to_contain_text("pairs the two models")
    page.locator("#latency-detail > summary").click()
    expect(page.locator(f'table#latency tr[data-level="{speed["level"]}"] td.ratio')).to_have_text(
        f"{speed['ratio']:.3f}"
    )
    shot(page, "job-latency-detail")


def test_growth_the_speed_did_not_pay_for_is_flagged(page: Page, tmp_path: Path, shot) -> None:
    """Four 1 MiB constants folded from a model of a few hundred bytes, not profiled."""
    model = tmp_path / "fills.onnx"
    onnx.save(constant_fills(4, (256, 1024)), model)
    _finished_job(page, model, "report fills", profile=False)
    size = page.locator("td#file-size")
    expect(size).to_have_attribute("data-flagged", "true")
    expect(size).to_contain_text(re.compile(r"B → 4\.0 MiB \(\d+x larger\)"))
    expect(size.locator("p.growth-note")).to_contain_text("did not pay for it (not measured)")
    row = page.locator("tr.growth-flagged", has=size)
    # Flagged in colour, not only in words: the row's cells take the warning background.
    background = row.locator("td").evaluate("td => getComputedStyle(td).backgroundColor")
    assert background == "rgb(255, 248, 197)", background
    size.scroll_into_view_if_needed()
    shot(page, "job-growth-flag")


def test_the_report_page_opens_in_the_browser(
    page: Page, context, server, profiled: str, shot
) -> None:
    job_ratio = page.locator("#speed-ratio").inner_text()
    job_verdict = page.locator("#speed-verdict").get_attribute("data-verdict")
    with context.expect_page() as opened:
        page.locator("a#report-page").click()
    report = opened.value
    report.wait_for_load_state()
    assert report.url == f"{server.url}/ui/jobs/{profiled}/report.html"  # opened, not saved
    expect(report.locator("h1")).to_contain_text("report conv-bn-relu")
    expect(report.locator("#speed-ratio")).to_have_text(job_ratio)
    expect(report.locator("#speed-verdict")).to_have_attribute("data-verdict", job_verdict)
    expect(report.locator("#regions svg").first).to_be_visible()
    shot(report, "report-page")
    response = httpx.get(report.url)
    assert "sandbox" in response.headers["content-security-policy"]
    assert response.headers["content-disposition"].startswith("inline")
    report.close()
