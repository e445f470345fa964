"""The dashboard in a real browser, against a real embedded server: submit a model and
watch the job live, register a pattern and see a job use it, and render hostile names
as text. Every test also checks (``watch`` in conftest.py) that nothing left 127.0.0.1,
no dialog opened and no script failed."""

from __future__ import annotations

import re
from pathlib import Path

import browser_support as support
import onnx
import pytest
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.browser, pytest.mark.slow]

LIVE = ("queued", "running")
JOB_URL = re.compile(r"/ui/jobs/(?P<id>[^/?#]+)$")

# Reports every change of the job page's status, stage and progress to the test, from
# the first moment of each document (so also after the page reloads itself).
OBSERVER = """
(() => {
  let last = null;
  const report = () => {
    const status = document.querySelector("#job-status");
    if (!status) return;
    const stage = document.querySelector("#job-stage");
    const progress = document.querySelector("#job-progress");
    const state = [
      status.getAttribute("data-status"),
      stage ? stage.textContent.trim() : null,
      progress ? progress.getAttribute("value") : null,
    ];
    const key = JSON.stringify(state);
    if (key === last) return;
    last = key;
    window.__jobState(performance.timeOrigin, ...state);
  };
  const start = () => {
    report();
    new MutationObserver(report).observe(document.documentElement, {
      subtree: true, childList: true, attributes: true, characterData: true,
    });
  };
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", start);
  } else {
    start();
  }
})();
"""


def write_model(folder: Path, name: str, **options) -> Path:
    path = folder / name
    onnx.save(support.conv_bn_relu_model(**options), path)
    return path


def submit(
    page: Page,
    model: Path | dict,
    *,
    model_name: str,
    profile: bool = False,
) -> str:
    """Fill in and send the Submit page; returns the job id of the page it lands on."""
    page.goto("/ui/submit")
    form = page.locator("form#submit-form")
    form.locator('input[type="file"][name="model"]').set_input_files(model)
    form.locator('input[name="model_name"]').fill(model_name)
    form.locator('select[name="target"]').select_option("generic")
    form.locator('input[name="profile"]').set_checked(profile)
    form.locator("button#submit").click()
    page.wait_for_url(JOB_URL)
    return JOB_URL.search(page.url)["id"]


def wait_for_report(page: Page) -> None:
    """The job page reloads itself when the job ends (HX-Refresh): never reload here."""
    page.locator("section#report").wait_for(state="visible", timeout=support.JOB_TIMEOUT_MS)
    expect(page.locator("#job-status")).to_have_attribute("data-status", "succeeded")


def test_submit_a_model_watch_it_live_and_download_the_fused_model(
    page: Page, tmp_path: Path
) -> None:
    original = write_model(tmp_path, "conv_bn_relu.onnx")
    states: list[tuple[float, str, str | None, str | None]] = []
    page.expose_function("__jobState", lambda doc, *state: states.append((doc, *state)))
    page.add_init_script(OBSERVER)

    job_id = submit(page, original, model_name="browser conv-bn-relu", profile=True)
    job_url = page.url
    assert page.locator("#job-status").get_attribute("data-status") in (*LIVE, "succeeded")

    # From here on the page runs itself: count navigations of the main frame and the
    # live section's polls until the report is there.
    navigations: list[str] = []
    polls: list[str] = []
    page.on(
        "framenavigated",
        lambda frame: navigations.append(frame.url) if frame == page.main_frame else None,
    )
    page.on(
        "request",
        lambda request: polls.append(request.url) if request.url.endswith("/live") else None,
    )
    wait_for_report(page)

    assert navigations in ([], [job_url]), f"the page navigated by itself: {navigations}"
    assert page.url == job_url
    statuses = [status for _, status, _, _ in states]
    assert statuses[0] in LIVE, f"the job page never showed the job live: {states}"
    assert statuses[-1] == "succeeded", states
    order = ("queued", "running", "succeeded")
    assert [order.index(s) for s in statuses] == sorted(order.index(s) for s in statuses), states
    progress = [float(value) for *_, value in states if value]
    assert progress == sorted(progress) and progress[-1] == 1.0, states
    first_document = states[0][0]
    assert all(doc == first_document for doc, status, *_ in states if status in LIVE), (
        f"live states came from more than one page load: {states}"
    )
    assert polls and all(f"/ui/jobs/{job_id}/live" in url for url in polls), polls
    assert page.locator("#live").count() == 0  # a finished job does not poll
    assert page.locator("#cancel-form").count() == 0

    report = page.locator("section#report")
    for part in ("#summary", "table#fusions", "table#near-misses", "#rollbacks"):
        expect(report.locator(part)).to_be_attached()
    expect(report.locator("table#validation")).to_be_visible()
    expect(report.locator("#op-type-chart svg").first).to_be_visible()  # profiled
    expect(report.locator("#regions svg").first).to_be_visible()
    expect(report.locator("table#fusions")).to_contain_text("conv_bn_relu")
    expect(page.locator("a#download-report")).to_be_visible()
    expect(page.locator("a#download-trace")).to_be_visible()  # profiled

    with page.expect_download(timeout=support.ACTION_TIMEOUT_MS) as download:
        page.locator("a#download-model").click()
    fused_path = tmp_path / "fused.onnx"
    download.value.save_as(fused_path)
    fused = onnx.load(fused_path)
    onnx.checker.check_model(fused, full_check=True)
    before = len(onnx.load(original).graph.node)
    assert len(fused.graph.node) < before, [n.op_type for n in fused.graph.node]

    # The jobs list shows it, finished, with a link to its page.
    page.goto("/ui/jobs")
    row = page.locator(f'table#jobs tr[data-job-id="{job_id}"]')
    expect(row).to_have_attribute("data-status", "succeeded")
    link = row.locator("a.job-link")
    expect(link).to_have_attribute("href", re.compile(rf"/ui/jobs/{job_id}$"))
    expect(link).to_contain_text("browser conv-bn-relu")


def test_a_pattern_created_in_the_dashboard_applies_to_the_next_job(
    page: Page, tmp_path: Path
) -> None:
    name = "browser.conv_bn_relu_first"
    page.goto("/ui")
    expect(page).to_have_url(re.compile(r"/ui/jobs$"))

    page.goto("/ui/patterns")
    expect(page.locator('table#patterns tr[data-pattern="conv_bn_relu"]')).to_be_visible()
    page.locator("a#new-pattern").click()
    expect(page).to_have_url(re.compile(r"/ui/patterns/new$"))
    form = page.locator("form#pattern-form")

    # An error first: it is shown next to the form, and nothing is registered.
    broken = support.renamed_pattern_yaml("conv_bn_relu", name, 90).replace(
        "name: fuse_activation", "name: no_such_rewriter"
    )
    form.locator('textarea[name="yaml"]').fill(broken)
    form.evaluate("form => form.requestSubmit()")
    expect(page.locator(".field-error").first).to_contain_text("no_such_rewriter")

    # The same pattern under a new name with a priority above the builtin conv_bn_relu.
    form = page.locator("form#pattern-form")
    form.locator('textarea[name="yaml"]').fill(
        support.renamed_pattern_yaml("conv_bn_relu", name, 90)
    )
    form.evaluate("form => form.requestSubmit()")
    expect(page).to_have_url(re.compile(rf"/ui/patterns/{re.escape(name)}$"))
    expect(page.locator("pre#pattern-yaml")).to_contain_text(name)
    expect(page.locator("table#versions tr:has(td)")).to_have_count(1)

    # Try it on a model from the pattern's page: it matches the Conv -> BN -> Relu.
    try_form = page.locator("form#try-form")
    try_form.locator('input[type="file"][name="model"]').set_input_files(
        write_model(tmp_path, "try.onnx", seed=3)
    )
    try_form.evaluate("form => form.requestSubmit()")
    expect(page.locator("section#try-result")).to_be_visible()
    expect(page.locator("section#try-result")).to_contain_text("conv")

    page.goto("/ui/patterns")
    row = page.locator(f'table#patterns tr[data-pattern="{name}"]')
    expect(row).to_have_attribute("data-enabled", "true")

    job_id = submit(
        page,
        write_model(tmp_path, "model.onnx", seed=1),
        model_name="uses the new pattern",
    )  # no strategy: the config's priority selection, so the higher priority wins
    wait_for_report(page)
    fusions = page.locator("section#report table#fusions")
    expect(fusions).to_contain_text(name)
    # Not profiled: no chart of time per op type and no trace to download.
    expect(page.locator("#op-type-chart svg")).to_have_count(0)
    expect(page.locator("a#download-trace")).to_have_count(0)

    # Turned off again, so the other tests see the builtin patterns only.
    page.goto(f"/ui/patterns/{name}")
    with page.expect_response(lambda response: response.request.method == "POST"):
        page.locator("button#toggle-enabled").click()
    page.goto("/ui/patterns")
    expect(page.locator(f'table#patterns tr[data-pattern="{name}"]')).to_have_attribute(
        "data-enabled", "false"
    )
    assert job_id


def test_hostile_names_render_as_text(page: Page, watch) -> None:
    payload = support.PAYLOAD
    model = support.conv_bn_relu_model(doc_string=payload, node_prefix=payload, seed=2)
    upload = {
        "name": f"{payload}.onnx",
        "mimeType": "application/octet-stream",
        "buffer": model.SerializeToString(),
    }
    job_id = submit(page, upload, model_name=payload)
    wait_for_report(page)

    def rendered_as_text() -> None:
        assert page.locator('img[src="x"]').count() == 0, page.url
        expect(page.get_by_text(payload).filter(visible=True).first).to_be_visible()

    rendered_as_text()  # the finished job page with its report
    assert page.locator("section#report").inner_text().count(payload) >= 1

    page.goto("/ui/jobs")
    expect(page.locator(f'tr[data-job-id="{job_id}"] a.job-link')).to_contain_text(payload)
    rendered_as_text()

    page.locator(f'tr[data-job-id="{job_id}"] a.job-link').click()
    page.locator("section#report").wait_for()
    rendered_as_text()
    assert watch.dialogs == []


def test_a_live_job_can_be_cancelled_from_its_page(page: Page, tmp_path: Path) -> None:
    submit(page, write_model(tmp_path, "cancel.onnx", seed=4), model_name="to be cancelled")
    expect(page.locator("#job-status")).to_have_attribute(
        "data-status", re.compile("queued|running")
    )
    page.locator("form#cancel-form button#cancel").click()
    expect(page.locator("#job-status")).to_have_attribute(
        "data-status", "cancelled", timeout=support.JOB_TIMEOUT_MS
    )
    expect(page.locator("section#report")).to_have_count(0)
    expect(page.locator("a#download-model")).to_have_count(0)


def test_the_jobs_list_follows_live_jobs_and_filters_them(page: Page, tmp_path: Path) -> None:
    job_id = submit(page, write_model(tmp_path, "listed.onnx", seed=5), model_name="listed")
    page.goto("/ui/jobs")
    row = page.locator(f'table#jobs tr[data-job-id="{job_id}"]')
    expect(row).to_have_attribute("data-status", re.compile("queued|running"))
    navigations: list[str] = []
    page.on(
        "framenavigated",
        lambda frame: navigations.append(frame.url) if frame == page.main_frame else None,
    )
    expect(row).to_have_attribute("data-status", "succeeded", timeout=support.JOB_TIMEOUT_MS)
    assert navigations == [], "the list reloaded instead of updating its rows"

    form = page.locator("form#job-filter")
    form.locator('select[name="status"]').select_option("failed")
    form.evaluate("form => form.requestSubmit()")
    expect(row).to_have_count(0)
    statuses = page.locator("table#jobs tr[data-job-id]").evaluate_all(
        "rows => rows.map(r => r.getAttribute('data-status'))"
    )
    assert set(statuses) <= {"failed"}, statuses
    form.locator('select[name="status"]').select_option("succeeded")
    form.evaluate("form => form.requestSubmit()")
    expect(row).to_have_attribute("data-status", "succeeded")


def test_the_strategies_page_lists_the_presets(page: Page) -> None:
    page.goto("/ui/strategies")
    for name in ("default", "vision", "nlp"):
        expect(page.locator(f'table#strategies tr[data-strategy="{name}"]')).to_be_visible()
