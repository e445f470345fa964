"""A pattern per machine class through the API and the dashboard (issue 28, item 3): the
per-class table, disabling a pattern on one class (patterns:write; on evidence; once)
and enabling it again, and what each tenant sees of the jobs behind the verdicts."""

from __future__ import annotations

import html as html_lib
import re
from datetime import datetime, timedelta

import pytest
from ui_testing import assert_page
from verdict_rows import FASTER, LEVEL, SLOWER, T0, machine, record, store

from autofusion.app.services.auth import create_key
from autofusion.app.services.pattern_class_rules import apply_auto_disable, rules
from autofusion.fusion_core.profiling.verdicts import machine_key

HERE_KEY, THERE_KEY = machine_key(machine(threads=1)), machine_key(machine(threads=4))
VERDICTS = "/v1/patterns/conv_bn_relu/verdicts"
RULES = "/v1/patterns/conv_bn_relu/rules"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def _keyed(make_service, **settings):
    """A server that requires keys, with verdicts of conv_bn_relu from two tenants."""
    service = make_service(require_api_keys=True, **settings)
    with service.db() as session:
        keys = {
            "reader": create_key(session, "tenant-a", ["jobs:write"], name="reader"),
            "writer": create_key(session, "tenant-a", ["patterns:write"], name="writer"),
            "other": create_key(session, "tenant-b", ["patterns:write"], name="other"),
        }
        store(
            session, [record(SLOWER, job="ja1"), record(SLOWER, job="ja2", minutes=1)], "tenant-a"
        )
        store(session, [record(SLOWER, job="jb1", region="r2", minutes=2)], "tenant-b")
    return service, keys


@pytest.fixture
def keyed(make_service):
    return _keyed(make_service)


def test_unshared_verdicts_count_the_tenants_own_only(make_service, problem) -> None:
    service, keys = _keyed(make_service, verdicts_shared=False)
    (here,) = service.client.get(VERDICTS, headers=bearer(keys["other"])).json()["classes"]
    assert (here["slower"], here["jobs"], here["your_jobs"]) == (1, 1, ["jb1"])
    body = {"machine_key": HERE_KEY, "reason": "slower"}
    rule = service.client.post(RULES, json=body, headers=bearer(keys["other"])).json()
    assert rule["evidence"]["measurements"] == 1  # on what this tenant may see
    with service.db() as session:  # another tenant's only verdict on another class
        store(session, [record(SLOWER, job="jc1", on=machine(threads=4))], "tenant-c")
    there = {**body, "machine_key": THERE_KEY}
    problem(
        service.client.post(RULES, json=there, headers=bearer(keys["writer"])), 422, "no-verdicts"
    )
    shown = service.client.get(VERDICTS, headers=bearer(keys["writer"])).json()["classes"]
    assert [c["machine_key"] for c in shown] == [HERE_KEY]


def test_the_verdicts_per_class_and_each_tenant_sees_its_own_jobs(keyed, problem) -> None:
    service, keys = keyed
    problem(service.client.get(VERDICTS), 401, "unauthorized")
    body = service.client.get(VERDICTS, headers=bearer(keys["reader"])).json()
    (here,) = body["classes"]
    assert (body["pattern"], body["rules"], here["rule"]) == ("conv_bn_relu", [], None)
    assert (here["machine_key"], here["faster"], here["level"], here["slower"]) == (
        HERE_KEY,
        0,
        0,
        3,
    )
    assert here["jobs"] == 3 and sorted(here["your_jobs"]) == ["ja1", "ja2"]
    assert here["combined"]["ratio"]["verdict"] == "slower" and here["combined"]["jobs"] == 3
    assert here["combined"]["ratio"]["low"] > 1 and len(here["signatures"]) == 2
    assert here["label"].startswith("Test CPU 9000 · 1 thread ·")
    assert here["evidence_url"] == f"/v1/verdicts?pattern=conv_bn_relu&machine_key={HERE_KEY}"
    other = service.client.get(VERDICTS, headers=bearer(keys["other"])).json()
    assert other["classes"][0]["your_jobs"] == ["jb1"]  # never another tenant's job ids
    assert "ja1" not in str(other)
    problem(
        service.client.get("/v1/patterns/nope/verdicts", headers=bearer(keys["reader"])),
        404,
        "pattern-not-found",
    )


def test_disable_needs_the_scope_and_evidence_and_is_reversible(keyed, problem) -> None:
    service, keys = keyed
    reader, writer = bearer(keys["reader"]), bearer(keys["writer"])
    body = {"machine_key": HERE_KEY, "reason": "slower on this CPU"}
    problem(service.client.post(RULES, json=body, headers=reader), 403, "forbidden")
    created = service.client.post(RULES, json=body, headers=writer)
    assert created.status_code == 201, created.text
    rule = created.json()
    assert (rule["pattern"], rule["machine_key"], rule["reason"]) == (
        "conv_bn_relu",
        HERE_KEY,
        body["reason"],
    )
    assert rule["created_by"].startswith("key:") and rule["machine"]["threads"] == 1
    assert rule["lapses_at"] is None  # a person's rule never lapses
    assert rule["evidence"]["combined"]["ratio"]["verdict"] == "slower"
    assert rule["evidence"]["measurements"] == 3 and len(rule["evidence"]["verdict_ids"]) == 3
    assert rule["evidence_url"].endswith(f"machine_key={HERE_KEY}")
    problem(service.client.post(RULES, json=body, headers=writer), 409, "pattern-rule-exists")
    elsewhere = {"machine_key": THERE_KEY, "reason": "x"}
    problem(service.client.post(RULES, json=elsewhere, headers=writer), 422, "no-verdicts")
    problem(
        service.client.post(RULES, json={"machine_key": "xyz", "reason": "x"}, headers=writer),
        422,
        "invalid-request",
    )
    problem(
        service.client.post(RULES, json={"machine_key": HERE_KEY, "reason": "  "}, headers=writer),
        422,
        "invalid-request",
    )
    unknown = service.client.post("/v1/patterns/nope/rules", json=body, headers=writer)
    problem(unknown, 404, "pattern-not-found")

    listed = service.client.get("/v1/pattern-rules", headers=reader).json()["rules"]
    assert [(r["pattern"], r["machine_key"]) for r in listed] == [("conv_bn_relu", HERE_KEY)]
    assert service.client.get("/v1/pattern-rules?pattern=conv_bn", headers=reader).json() == {
        "rules": []
    }
    shown = service.client.get(VERDICTS, headers=reader).json()
    assert shown["classes"][0]["rule"]["reason"] == body["reason"] and len(shown["rules"]) == 1

    one = f"{RULES}/{HERE_KEY}"
    problem(service.client.delete(one, headers=reader), 403, "forbidden")
    assert service.client.delete(one, headers=writer).status_code == 204
    problem(service.client.delete(one, headers=writer), 404, "pattern-rule-not-found")
    assert service.client.get("/v1/pattern-rules", headers=reader).json() == {"rules": []}


def test_the_dashboard_needs_the_scope_to_disable(keyed) -> None:
    service, keys = keyed
    signed_in = service.client.post(
        "/ui/login", data={"key": keys["reader"]}, follow_redirects=False
    )
    assert signed_in.status_code == 303
    page = assert_page(service.client.get("/ui/patterns/conv_bn_relu"), "class-stats")
    assert "Disable on this machine class" in page  # shown; the write checks the scope
    refused = service.client.post(
        f"/ui/patterns/conv_bn_relu/classes/{HERE_KEY}/disable", data={"reason": "x"}
    )
    assert_page(refused, status=403)
    with service.db() as session:
        assert rules(session) == []


def _class_row(html: str, key: str) -> str:
    return re.search(rf'<tr data-machine-key="{key}".*?</tr>', html, re.S).group(0)


def test_the_pattern_page_shows_each_class_and_its_buttons_work(service) -> None:
    with service.db() as session:
        store(
            session,
            [
                record(FASTER, job="j1"),
                record(LEVEL, job="j2"),
                record(SLOWER, job="j3", region="r2"),
            ],
        )
        store(session, [record(SLOWER, job="j4", on=machine(threads=4), minutes=5)])
    page = assert_page(
        service.client.get("/ui/patterns/conv_bn_relu"),
        "machine-classes",
        "class-stats",
        "no-class-rules",
    )
    here = _class_row(page, HERE_KEY)
    counts = {
        k: re.search(rf'class="count-{k}">(\d+)<', here).group(1)
        for k in ("faster", "level", "slower")
    }
    assert counts == {"faster": "1", "level": "1", "slower": "1"}
    assert 'data-verdict="no measurable change"' in here and 'data-disabled="false"' in here
    assert html_lib.escape(f"/v1/verdicts?pattern=conv_bn_relu&machine_key={HERE_KEY}") in here
    assert 'href="/ui/jobs/j1"' in here and 'href="/ui/jobs/j3"' in here  # the viewer's jobs
    assert 'for="reason-' in here and "Disable on this machine class</button>" in here
    there = _class_row(page, THERE_KEY)
    assert 'data-verdict="slower"' in there and 'class="suggested"' in there
    assert page.index(THERE_KEY) < page.index(HERE_KEY)  # newest measurement first
    assert "class-rule-marker" not in service.client.get("/ui/patterns").text

    form = f"/ui/patterns/conv_bn_relu/classes/{THERE_KEY}/disable"
    assert_page(service.client.post(form, data={"reason": " "}), status=422)
    done = service.client.post(
        form, data={"reason": "slower with 4 threads"}, follow_redirects=False
    )
    assert (done.status_code, done.headers["location"]) == (
        303,
        "/ui/patterns/conv_bn_relu#machine-classes",
    )
    page = assert_page(service.client.get("/ui/patterns/conv_bn_relu"), "class-rules")
    assert 'data-disabled="true"' in _class_row(page, THERE_KEY)
    rule = re.search(r'<tr id="rule-[0-9a-f]{12}" data-machine-key="(\w+)">(.*?)</tr>', page, re.S)
    assert rule.group(1) == THERE_KEY
    assert "slower with 4 threads" in rule.group(2) and "anonymous" in rule.group(2)
    assert "Enable again</button>" in rule.group(2) and "the verdicts</a>" in rule.group(2)
    assert "rule-lapses" not in rule.group(2)  # a person's rule never lapses
    listing = service.client.get("/ui/patterns").text
    marker = re.search(r'<tr data-pattern="conv_bn_relu".*?</tr>', listing, re.S).group(0)
    assert 'class="class-rule-marker"' in marker and "disabled on 1 machine class" in marker
    assert listing.count('class="class-rule-marker"') == 1

    again = service.client.post(
        f"/ui/patterns/conv_bn_relu/classes/{THERE_KEY}/enable", follow_redirects=False
    )
    assert again.status_code == 303
    page = assert_page(service.client.get("/ui/patterns/conv_bn_relu"), "no-class-rules")
    assert 'data-disabled="false"' in _class_row(page, THERE_KEY)
    missing = service.client.post(f"/ui/patterns/conv_bn_relu/classes/{THERE_KEY}/enable")
    assert_page(missing, status=404)


def test_an_automatic_rule_says_when_it_lapses(service) -> None:
    """The page dates an automatic rule's lapse: its creation plus verdict_max_age_days."""
    on = service.settings.model_copy(
        update={"verdicts_auto_disable": True, "verdicts_auto_disable_min_jobs": 1}
    )
    made = T0 + timedelta(days=2)
    with service.db() as session:
        store(session, [record(SLOWER, job="j1")])
        assert apply_auto_disable(session, on, ["conv_bn_relu"], now=made) == ["conv_bn_relu"]
        rules(session, "conv_bn_relu")[0].created_at = made
    page = assert_page(service.client.get("/ui/patterns/conv_bn_relu"), "class-rules")
    rule = re.search(r'<tr id="rule-[0-9a-f]{12}" data-machine-key="\w+">(.*?)</tr>', page, re.S)
    lapses = made + timedelta(days=service.settings.verdict_max_age_days)
    assert f"lapses {lapses:%Y-%m-%d}, when its evidence is no longer fresh" in rule.group(1)
    (listed,) = service.client.get("/v1/pattern-rules").json()["rules"]
    assert listed["created_by"] == "auto"
    assert datetime.fromisoformat(listed["lapses_at"]) == lapses


def test_a_pattern_never_measured_says_so(service) -> None:
    page = assert_page(
        service.client.get("/ui/patterns/conv_bn"), "no-class-stats", "no-class-rules"
    )
    assert "Disable on this machine class" not in page
