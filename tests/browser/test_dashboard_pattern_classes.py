"""A pattern per machine class in a real browser (issue 28): the table on the pattern's
page, "Disable on this machine class" with its reason (a real form post, so the
cross-site guard sees what a browser sends), the rule with who, when and why, the
list's marker, and "Enable again". Screenshots of each step (``shot``)."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from autofusion.app.core.db import session_scope
from tests.app.verdict_rows import FASTER, SLOWER, machine, record, store

pytestmark = [pytest.mark.browser]

PATTERN = "gelu_tanh"  # a pattern the other dashboard tests leave alone


def test_disable_a_pattern_on_one_class_and_enable_it_again(page: Page, server, shot) -> None:
    slow, fast = machine(threads=2, cpu="Browser CPU"), machine(threads=8, cpu="Browser CPU")
    with session_scope(f"sqlite:///{server.data_dir / 'autofusion.db'}") as session:
        runs = [
            record(SLOWER, job=f"b{k}", pattern=PATTERN, on=slow, region=f"r{k}") for k in range(3)
        ]
        store(session, [*runs, record(FASTER, job="b9", pattern=PATTERN, on=fast)])

    page.goto(f"/ui/patterns/{PATTERN}")
    table = page.locator("table#class-stats")
    expect(table.locator("tbody tr")).to_have_count(2)
    row = table.locator('tr[data-verdict="slower"]')
    expect(row.locator(".count-slower")).to_have_text("3")
    expect(row.locator("th")).to_contain_text("Browser CPU · 2 threads")
    shot(page, "pattern-classes")

    row.get_by_label("Reason").fill("slower with 2 threads")
    row.get_by_role("button", name="Disable on this machine class").click()
    expect(page.locator("#class-rules tbody tr")).to_have_count(1)
    expect(page.locator("#class-rules .rule-reason")).to_have_text("slower with 2 threads")
    expect(page.locator('#class-stats tr[data-verdict="slower"]')).to_have_attribute(
        "data-disabled", "true"
    )
    expect(page.locator('#class-stats tr[data-verdict="faster"]')).to_have_attribute(
        "data-disabled", "false"
    )
    shot(page, "pattern-classes-disabled")

    page.goto(f"/ui/patterns?q={PATTERN}")
    expect(page.locator(f'tr[data-pattern="{PATTERN}"] .class-rule-marker')).to_have_text(
        "disabled on 1 machine class"
    )

    page.goto(f"/ui/patterns/{PATTERN}")
    page.get_by_role("button", name="Enable again").click()
    expect(page.locator("#no-class-rules")).to_be_visible()
    expect(page.locator('#class-stats tr[data-verdict="slower"]')).to_have_attribute(
        "data-disabled", "false"
    )
