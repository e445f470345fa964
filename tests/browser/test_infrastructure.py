"""The harness of the dashboard tests: the server, the browser, the request guard, and
skipping or failing where there is no browser."""

from __future__ import annotations

from pathlib import Path

import browser_support as support
import pytest

pytestmark = pytest.mark.browser


def test_the_server_answers_the_browser(page, server) -> None:
    response = page.goto("/healthz")
    assert response is not None and response.status == 200
    assert page.url == f"{server.url}/healthz"
    assert server.url.startswith(f"http://{support.LOOPBACK}:")
    assert '"ok"' in page.inner_text("body")


def test_requests_to_other_hosts_are_aborted_and_recorded(page, watch) -> None:
    page.goto("/healthz")
    outcome = page.evaluate(
        """async (url) => {
            try { await fetch(url); return "answered"; } catch (e) { return "blocked"; }
        }""",
        "http://192.0.2.1/beacon",  # TEST-NET-1: routable nowhere, and never reached
    )
    page.set_content('<img src="https://example.invalid/pixel.png">')
    page.wait_for_load_state("load")
    assert outcome == "blocked"
    assert watch.guard.foreign == [
        "http://192.0.2.1/beacon",
        "https://example.invalid/pixel.png",
    ]
    assert any(url.endswith("/healthz") for url in watch.guard.seen)
    watch.guard.foreign.clear()  # seen and stopped: the autouse check passes


def test_dialogs_are_recorded(page, watch) -> None:
    page.goto("/healthz")
    page.evaluate("() => alert('hello')")
    assert watch.dialogs == ["alert: hello"]
    watch.dialogs.clear()


def test_no_browser_skips_with_how_to_install_or_fails_where_required(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(support, "CHROMIUM", tmp_path / "no-chromium")
    reason = support.browser_missing()
    assert reason is not None and "apt-get install -y chromium" in reason

    monkeypatch.delenv(support.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="apt-get install"):
        support.unavailable(reason)
    monkeypatch.setenv(support.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=support.REQUIRE_ENV):
        support.unavailable(reason)
