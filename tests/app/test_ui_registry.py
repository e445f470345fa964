"""The dashboard's pattern and strategy pages: YAML forms, errors by field, history,
enable/disable, and trying a pattern on a model."""

from __future__ import annotations

import html as html_lib
import re

import pytest
from ui_testing import assert_page, conv_bn_relu, multipart

from autofusion.app.core.models import Job

GOOD = """\
name: acme.conv_relu
description: A Relu after a Conv.
priority: 10
nodes:
  - {id: conv, op: Conv}
  - {id: act, op: Relu, inputs: {"0": conv}}
rewriter: {name: fused_region, params: {domain: ai.acme}}
"""


def _create(service, text: str = GOOD):
    return service.client.post("/ui/patterns/new", data={"yaml": text}, follow_redirects=False)


def _errors(html: str) -> dict[str, str]:
    found = re.findall(r'<div class="field-error" data-field="([^"]+)">([^<]*)</div>', html)
    return {field: html_lib.unescape(message) for field, message in found}


def _textarea(html: str) -> str:
    return html_lib.unescape(re.search(r"<textarea[^>]*>(.*?)</textarea>", html, re.S).group(1))


def test_the_patterns_list_has_every_pattern(service):
    html = assert_page(service.client.get("/ui/patterns"), "patterns", "new-pattern")
    assert '<tr data-pattern="conv_bn" data-enabled="true">' in html
    assert 'href="/ui/patterns/new"' in html and 'href="/ui/patterns/conv_bn"' in html


def test_a_pattern_that_does_not_compile_is_shown_with_its_errors(service):
    text = GOOD.replace("op: Relu", "op: NoSuchOp")
    response = _create(service, text)
    html = assert_page(response, "pattern-form", status=422)
    errors = _errors(html)
    assert "nodes.1.op" in errors and "NoSuchOp" in errors["nodes.1.op"]
    assert _textarea(html) == text
    assert service.client.get("/ui/patterns/acme.conv_relu").status_code == 404


@pytest.mark.parametrize(
    ("text", "field"),
    [("name: [unclosed", "yaml"), ("- a list\n- not a mapping\n", "yaml")],
    ids=["not-yaml", "not-a-mapping"],
)
def test_text_that_is_not_a_pattern_document(service, text, field):
    html = assert_page(_create(service, text), "pattern-form", status=422)
    assert field in _errors(html) and _textarea(html) == text


def test_create_view_edit_toggle_and_history(service):
    created = _create(service)
    assert created.status_code == 303
    assert created.headers["location"] == "/ui/patterns/acme.conv_relu"
    again = _create(service)
    assert again.status_code == 409 and "name" in _errors(again.text)

    page = assert_page(
        service.client.get("/ui/patterns/acme.conv_relu"),
        "pattern-yaml",
        "versions",
        "toggle-enabled",
        "edit-pattern",
        "try-form",
    )
    assert "A Relu after a Conv." in page and ">Disable</button>" in page

    form = service.client.get("/ui/patterns/acme.conv_relu/edit").text
    assert '<input type="hidden" name="version" value="1">' in form
    edited = _textarea(form).replace("A Relu after a Conv.", "Edited.")
    response = service.client.post(
        "/ui/patterns/acme.conv_relu/edit",
        data={"yaml": edited, "version": "1"},
        follow_redirects=False,
    )
    assert response.status_code == 303
    # Someone else's edit since version 1: optimistic concurrency says so, text kept.
    stale = service.client.post(
        "/ui/patterns/acme.conv_relu/edit", data={"yaml": edited + "\n", "version": "1"}
    )
    assert stale.status_code == 412 and "version" in _errors(stale.text)
    assert _textarea(stale.text) == edited + "\n"
    bad = service.client.post(
        "/ui/patterns/acme.conv_relu/edit",
        data={"yaml": edited.replace("acme.conv_relu", "acme.other"), "version": "2"},
    )
    assert bad.status_code == 422 and "name" in _errors(bad.text)

    toggled = service.client.post(
        "/ui/patterns/acme.conv_relu/toggle", data={"version": "2"}, follow_redirects=False
    )
    assert toggled.status_code == 303
    page = service.client.get("/ui/patterns/acme.conv_relu").text
    assert 'data-enabled="false"' in page and ">Enable</button>" in page
    assert "Edited." in page
    listing = service.client.get("/ui/patterns").text
    assert '<tr data-pattern="acme.conv_relu" data-enabled="false">' in listing
    versions = re.findall(r'href="/ui/patterns/acme.conv_relu/versions/(\d+)"', page)
    assert versions == ["1", "2", "3"]
    first = assert_page(
        service.client.get("/ui/patterns/acme.conv_relu/versions/1"), "pattern-yaml"
    )
    assert "A Relu after a Conv." in first and "Edited." not in first
    assert service.client.get("/ui/patterns/acme.conv_relu/versions/9").status_code == 404


def test_try_a_pattern_on_a_model(service):
    model = conv_bn_relu(prefix="n_").SerializeToString()
    response = service.client.post("/ui/patterns/conv_bn_relu/try", **multipart(model))
    html = assert_page(response, "try-result", "matches", "trial-near-misses")
    matches = re.search(r'<table id="matches">.*?</table>', html, re.S).group(0)
    assert "<mark>n_conv</mark>" in matches and "<mark>n_relu</mark>" in matches
    pictures = re.search(r'<div id="match-pictures".*?</figure>\s*</div>', html, re.S).group(0)
    assert pictures.count("<svg") == 1 and "n_conv" in pictures
    assert service.job_count() == 0 and service.uploads_left() == []
    # A pattern that does not match says why, as a near miss.
    miss = service.client.post("/ui/patterns/conv_add/try", **multipart(model))
    assert "No match." in miss.text


def test_try_with_a_bad_model_shows_the_error_by_the_file_input(service):
    response = service.client.post("/ui/patterns/conv_bn/try", **multipart(b"not a model"))
    html = assert_page(response, "try-form", status=422)
    assert "model" in _errors(html) and 'id="try-result"' not in html


def test_strategies_list_create_and_edit(service):
    html = assert_page(service.client.get("/ui/strategies"), "strategies")
    assert '<tr data-strategy="vision">' in html

    text = "name: acme.mobile\npatterns: [conv_bn, no_such_pattern]\n"
    response = service.client.post("/ui/strategies/new", data={"yaml": text})
    html = assert_page(response, "strategy-form", status=422)
    assert "patterns.1" in _errors(html) and _textarea(html) == text
    invalid = service.client.post("/ui/strategies/new", data={"yaml": "name: 1bad\nfoo: 2\n"})
    assert invalid.status_code == 422 and {"name", "foo"} <= set(_errors(invalid.text))

    good = "name: acme.mobile\ndescription: Mobile.\npatterns: [conv_bn]\n"
    created = service.client.post("/ui/strategies/new", data={"yaml": good}, follow_redirects=False)
    assert created.status_code == 303
    assert created.headers["location"] == "/ui/strategies/acme.mobile"
    page = assert_page(service.client.get("/ui/strategies/acme.mobile"), "strategy-yaml")
    assert "Mobile." in page
    form = service.client.get("/ui/strategies/acme.mobile/edit").text
    assert '<input type="hidden" name="version" value="1">' in form
    edited = _textarea(form).replace("Mobile.", "Phones.")
    response = service.client.post(
        "/ui/strategies/acme.mobile/edit",
        data={"yaml": edited, "version": "1"},
        follow_redirects=False,
    )
    assert response.status_code == 303
    assert "Phones." in service.client.get("/ui/strategies/acme.mobile").text
    stale = service.client.post(
        "/ui/strategies/acme.mobile/edit", data={"yaml": edited, "version": "1"}
    )
    assert stale.status_code == 412 and "version" in _errors(stale.text)
    # The new strategy is offered on the submit form.
    assert '<option value="acme.mobile"' in service.client.get("/ui/submit").text
    with service.db() as session:
        assert session.query(Job).count() == 0


@pytest.mark.parametrize(
    ("headers", "refused"),
    [
        ({"Sec-Fetch-Site": "cross-site"}, True),
        ({"Sec-Fetch-Site": "same-site"}, True),
        ({"Origin": "http://evil.example"}, True),
        ({"Origin": "null"}, True),
        ({"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"}, False),
        ({"Origin": "http://testserver"}, False),
        ({}, False),  # not a browser: no ambient credentials to abuse
    ],
)
def test_a_cross_site_form_post_is_refused_without_keys(service, headers, refused):
    """Without API keys any page the user visits could post to 127.0.0.1."""
    version = service.client.get("/v1/patterns/conv_bn_relu").json()["version"]
    response = service.client.post(
        "/ui/patterns/conv_bn_relu/toggle",
        data={"version": str(version)},
        headers=headers,
        follow_redirects=False,
    )
    enabled = service.client.get("/v1/patterns/conv_bn_relu").json()["enabled"]
    if refused:
        assert response.status_code == 403 and "cross-site" in response.text
        assert enabled is True
    else:
        assert response.status_code == 303 and enabled is False
