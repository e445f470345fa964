"""Fixtures for the dashboard tests: one real server for the session, Debian's chromium
driven by Playwright, and a fresh browser context per test that may talk to 127.0.0.1
only.

Without chromium (or playwright) the tests skip with how to install them; with
``AUTOFUSION_REQUIRE_BROWSER=1`` (set by ``.ci/run``) they fail instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.browser import browser_support as support

# Each job sleeps this long in the sandbox before optimizing, so it is seen while live.
JOB_DELAY_S = 2.0


@pytest.fixture(scope="session")
def browser_available() -> None:
    reason = support.browser_missing()
    if reason is not None:
        support.unavailable(reason)


@pytest.fixture(scope="session")
def server(browser_available, tmp_path_factory: pytest.TempPathFactory) -> Iterator:
    """``autofusion serve`` in embedded mode on a free port of 127.0.0.1, own data dir."""
    with support.running_server(
        tmp_path_factory.mktemp("browser-server"), job_delay_s=JOB_DELAY_S
    ) as running:
        yield running


@pytest.fixture(scope="session")
def playwright(browser_available) -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        yield pw


@pytest.fixture(scope="session")
def browser(playwright) -> Iterator:
    try:
        browser = support.launch_chromium(playwright)
    except Exception as exc:  # a broken install: say how to fix it
        support.unavailable(
            f"chromium at {support.CHROMIUM} did not start: {exc}; {support.INSTALL_HINT}"
        )
    yield browser
    browser.close()


@dataclass
class Watch:
    """What a test's browser context did that no test may cause."""

    guard: object = field(default_factory=lambda: support.RequestGuard())
    dialogs: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)


@pytest.fixture(autouse=True)
def watch() -> Iterator[Watch]:
    """After each test: no request left 127.0.0.1, no dialog opened, no script error."""
    watch = Watch()
    yield watch
    assert watch.guard.foreign == [], "requests to other hosts than 127.0.0.1 (aborted)"
    assert watch.dialogs == [], "the page opened dialogs"
    assert watch.page_errors == [], "uncaught script errors in the page"


@pytest.fixture
def context(browser, server, watch: Watch) -> Iterator:
    context = browser.new_context(
        base_url=server.url, viewport=support.VIEWPORT, accept_downloads=True
    )
    context.set_default_timeout(support.ACTION_TIMEOUT_MS)
    context.set_default_navigation_timeout(support.ACTION_TIMEOUT_MS)
    watch.guard.install(context)

    def on_dialog(dialog) -> None:
        watch.dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.dismiss()

    context.on("dialog", on_dialog)
    context.on("weberror", lambda error: watch.page_errors.append(str(error.error)))
    yield context
    context.close()


@pytest.fixture
def page(context) -> Iterator:
    page = context.new_page()
    yield page
    page.close()


@pytest.fixture
def shot(tmp_path: Path):
    """``shot(page, name)``: a PNG of the viewport, checked to be a real picture."""
    folder = Path(os.environ.get("AUTOFUSION_SCREENSHOT_DIR") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)

    def take(page, name: str) -> Path:
        path = folder / f"{name}.png"
        page.screenshot(path=path)
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000
        return path

    return take
