"""Take the dashboard screenshots of the README ("Dashboard") in Debian's chromium.

    make screenshots          # = python tests/browser/screenshots.py --out docs/screenshots

Starts a throwaway embedded server (its own temporary data folder, a free port of
127.0.0.1; each job waits a few seconds in its sandbox so that a running job can be
pictured), submits the small test models, and saves one 1280x900 PNG per page. The
browser may talk to 127.0.0.1 only; the script fails if a page tried anything else.
"""

from __future__ import annotations

import argparse
import re
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent


sys.path.insert(0, str(HERE.parents[1]))  # run as a script: the repository root
from tests.browser import browser_support as support  # noqa: E402

ROOT = support.ROOT
RESNET = ROOT / "tests" / "data" / "resnet" / "resnet50_w8_torchscript.onnx"
BERT = ROOT / "tests" / "data" / "transformers" / "bert_sdpa_dynamo.onnx"
JOB_URL = re.compile(r"/ui/jobs/[^/?#]+$")
JOB_DELAY_S = 5.0


def _submit(page, model: Path, name: str, *, profile: bool, before_sending=None) -> str:
    page.goto("/ui/submit")
    form = page.locator("form#submit-form")
    form.locator('input[type="file"][name="model"]').set_input_files(model)
    form.locator('input[name="model_name"]').fill(name)
    form.locator('input[name="profile"]').set_checked(profile)
    if before_sending is not None:
        before_sending()
    form.locator("button#submit").click()
    page.wait_for_url(JOB_URL)
    return page.url


def _scroll_to(page, selector: str, margin_px: int = 60) -> None:
    """Scroll so that this element starts near the top of the viewport."""
    page.locator(selector).first.evaluate(
        "(el, margin) => window.scrollTo(0, el.getBoundingClientRect().top + window.scrollY"
        " - margin)",
        margin_px,
    )


def _wait_finished(page) -> None:
    page.locator("section#report").wait_for(state="visible", timeout=support.JOB_TIMEOUT_MS)


def take(out: Path, work: Path) -> list[Path]:
    import onnx
    from playwright.sync_api import expect, sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    shots: list[Path] = []

    def shot(page, name: str, *, settled: bool = True) -> None:
        if settled:  # not for a live job page: it polls every second
            page.wait_for_load_state("networkidle")
        path = out / f"{name}.png"
        page.screenshot(path=path)
        shots.append(path)
        print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")

    tiny = work / "conv_bn_relu.onnx"
    onnx.save(support.conv_bn_relu_model(), tiny)

    with (
        support.running_server(work / "data", job_delay_s=JOB_DELAY_S) as server,
        sync_playwright() as pw,
    ):
        browser = support.launch_chromium(pw)
        context = browser.new_context(
            base_url=server.url, viewport=support.VIEWPORT, accept_downloads=False
        )
        context.set_default_timeout(support.ACTION_TIMEOUT_MS)
        guard = support.RequestGuard()
        guard.install(context)
        page = context.new_page()

        # Two finished jobs for the list, then one pictured while it runs.
        _submit(page, tiny, "conv-bn-relu (tiny)", profile=False)
        _wait_finished(page)
        _submit(page, BERT, "bert-sdpa (dynamo)", profile=True)
        _wait_finished(page)

        _submit(
            page, RESNET, "resnet50-w8", profile=True, before_sending=lambda: shot(page, "submit")
        )
        expect(page.locator("#job-status")).to_have_attribute(
            "data-status", "running", timeout=support.JOB_TIMEOUT_MS
        )
        # The sandbox waits JOB_DELAY_S in this stage: the picture is of a job under way.
        expect(page.locator("#job-stage")).to_have_text("prepasses", timeout=support.JOB_TIMEOUT_MS)
        shot(page, "job-running", settled=False)
        _wait_finished(page)
        shot(page, "job-finished")
        _scroll_to(page, "table#validation")
        shot(page, "job-report-chart")
        _scroll_to(page, "#slowest-nodes")
        shot(page, "job-report-slowest")
        _scroll_to(page, "#fusions-heading")
        shot(page, "job-report-regions")

        page.goto("/ui/jobs")
        shot(page, "jobs")

        page.goto("/ui/patterns")
        shot(page, "patterns")
        page.goto("/ui/patterns?q=LayerNormalization")  # the search, as the plain form sends it
        shot(page, "patterns-search")
        page.goto("/ui/patterns/conv_bn_relu")
        shot(page, "pattern")

        page.goto("/ui/patterns/new")
        broken = support.renamed_pattern_yaml("conv_bn_relu", "acme.conv_bn_relu", 90).replace(
            "op: BatchNormalization", "op: BatchNorm"
        )
        page.locator('form#pattern-form textarea[name="yaml"]').fill(broken)
        page.locator("form#pattern-form").evaluate("form => form.requestSubmit()")
        page.locator(".field-error").first.wait_for()
        shot(page, "pattern-error")

        page.goto("/ui/strategies")
        shot(page, "strategies")

        context.close()
        browser.close()

    if guard.foreign:
        raise SystemExit(f"pages tried to reach other hosts: {guard.foreign}")
    return shots


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "screenshots")
    args = parser.parse_args(argv)
    support.chromium_available_for_scripts()
    with tempfile.TemporaryDirectory(prefix="autofusion-screenshots-") as work:
        # mkdtemp makes it private (700); a service started as root runs its sandboxes as
        # `nobody`, which must pass through the data directory's parents (docs/service.md)
        Path(work).chmod(0o711)
        take(args.out.resolve(), Path(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
