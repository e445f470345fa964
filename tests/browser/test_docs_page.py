"""The interactive API docs (/docs, Swagger UI) render offline: the browser context
reaches 127.0.0.1 only (``watch`` in conftest.py fails a test that tried another host),
and every operation of the published document is listed."""

from __future__ import annotations

import json

import pytest
from playwright.sync_api import expect

pytestmark = pytest.mark.browser


def _operations(page) -> list[tuple[str, str]]:
    document = json.loads(page.request.get("/openapi.json").text())
    return [(method, path) for path, item in document["paths"].items() for method in item]


def test_swagger_ui_lists_every_operation_offline(page, watch) -> None:
    page.goto("/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("autofusion")
    operations = _operations(page)
    blocks = page.locator(".opblock")
    expect(blocks).to_have_count(len(operations))
    optimize = page.locator(".opblock-post", has_text="/v1/optimize")
    expect(optimize).to_be_visible()
    # The security schemes of app/api/deps.py: the Authorize button takes a key.
    expect(page.locator(".btn.authorize")).to_be_visible()
    assert all(url.startswith("http://127.0.0.1:") for url in watch.guard.seen)
