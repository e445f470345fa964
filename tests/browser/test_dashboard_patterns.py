"""The patterns page in a real browser (issue 27): grouped by family, searched as one
types (htmx swaps the results and the URL follows, the page is not reloaded) and with
the plain form when JavaScript is off, one-line descriptions with the whole text one
click away. Each step leaves a screenshot (``AUTOFUSION_SCREENSHOT_DIR``, else the
test's temporary folder) of what a user saw."""

from __future__ import annotations

import re

import browser_support as support
import pytest
from playwright.sync_api import Page, expect

pytestmark = [pytest.mark.browser]

ROWS = "table#patterns tr[data-pattern]"


def _names(page: Page) -> list[str]:
    return page.locator(ROWS).evaluate_all("rows => rows.map(r => r.dataset.pattern)")


def test_patterns_are_grouped_and_searched_as_one_types(page: Page, shot) -> None:
    page.goto("/ui/patterns")
    families = page.locator("table#patterns tbody.pattern-group")
    expect(families.first).to_have_attribute("data-family", "Attention")
    assert families.count() >= 6
    folded = page.locator('tbody[data-family="Folded into Conv or Gemm"]')
    expect(folded.locator('tr[data-pattern="conv_bn"]')).to_have_count(1)
    everything = len(_names(page))
    # One line per description: no row is taller than a few lines of text.
    heights = page.locator(ROWS).evaluate_all("rows => rows.map(r => r.offsetHeight)")
    assert max(heights) < 80, max(heights)
    shot(page, "patterns-grouped")

    page.evaluate("window.__sameDocument = true")  # gone if the page reloads
    page.locator("#pattern-q").press_sequentially("LayerNormalization", delay=20)
    expect(page).to_have_url(re.compile(r"/ui/patterns\?q=LayerNormalization$"))
    expect(page.locator("#pattern-counts")).to_contain_text("match “LayerNormalization”")
    names = _names(page)
    assert names and len(names) < everything
    assert all("norm" in name for name in names), names
    assert page.evaluate("window.__sameDocument === true"), "the search reloaded the page"
    shot(page, "patterns-search")

    page.locator("#pattern-q").fill("no such fusion anywhere")
    expect(page.locator("#no-patterns")).to_be_visible()
    shot(page, "patterns-search-empty")


def test_the_search_works_without_javascript_and_more_opens_the_whole_text(
    browser, server, watch, shot
) -> None:
    context = browser.new_context(
        base_url=server.url, viewport=support.VIEWPORT, java_script_enabled=False
    )
    context.set_default_timeout(support.ACTION_TIMEOUT_MS)
    watch.guard.install(context)
    try:
        page = context.new_page()
        page.goto("/ui/patterns")
        page.locator("#pattern-q").fill("rotate_half")
        page.locator("#pattern-search-go").click()
        expect(page).to_have_url(re.compile(r"\?q=rotate_half$"))
        assert _names(page) == ["rotary_embedding"]
        shot(page, "patterns-search-no-js")
        page.locator('tr[data-pattern="rotary_embedding"] a.more').click()
        expect(page).to_have_url(re.compile(r"/ui/patterns/rotary_embedding$"))
        expect(page.locator("#pattern-description")).to_contain_text("rotate_half")
        expect(page.locator("#pattern-usage")).to_contain_text("Never fired")
        shot(page, "pattern-description")
    finally:
        context.close()
