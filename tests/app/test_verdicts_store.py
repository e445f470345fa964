"""The verdict store's service (app/services/verdicts.py, verdict_pages.py), on SQLite and
PostgreSQL: a job's records stored as the worker says (never as the sandbox's file
says), the prefetch a job's sandbox gets (age, onnxruntime, CPU and tenant filters),
the listing (filters, page tokens, foreign job ids hidden), import (duplicates, invalid
records) and export. One database per backend for the module; each test empties it."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, select

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import Job, Verdict
from autofusion.app.migrate import upgrade
from autofusion.app.services import verdicts
from autofusion.app.services.verdict_pages import list_verdicts
from autofusion.fusion_core.profiling.verdicts import VERDICTS_FORMAT, VerdictRecord, machine_key
from tests import services
from tests.app.verdicts_testing import KEY, LISTED, MACHINE, NOW, record, row


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def database(request, tmp_path_factory) -> Iterator[str]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path_factory.mktemp('verdicts') / 'store.db'}"
        upgrade(url)
        yield url
        return
    with services.fresh_postgres_database() as url:
        upgrade(url)
        yield url


@pytest.fixture
def url(database: str) -> str:
    with session_scope(database) as session:
        session.execute(delete(Verdict))
    return database


def settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(data_dir=tmp_path, **values)


def test_the_file_form_is_fusion_cores(url):
    assert verdicts.FILE_FORMAT == VERDICTS_FORMAT
    with session_scope(url) as session:
        session.add(row(1, job_id="job-1", tenant_id="acme"))
    with session_scope(url) as session:
        stored = session.scalars(select(Verdict)).one()
        form = verdicts.verdict_dict(stored, job_id="job-1")
    parsed = VerdictRecord.from_dict(form)  # the API's and the export's form is the file's
    assert parsed.to_dict() == form
    expected = record(1, job_id="job-1")
    assert {k: v for k, v in form.items() if k != "measured_at"} == {
        k: v for k, v in expected.items() if k != "measured_at"
    }
    assert parsed.when == NOW  # UTC, microseconds kept


def test_a_jobs_verdicts_are_stored_as_the_worker_says(url, tmp_path, monkeypatch):
    hooked: list[list[str]] = []
    monkeypatch.setattr(
        "autofusion.app.services.verdicts.apply_auto_disable",
        lambda session, settings, patterns, now: hooked.append(list(patterns)) or [],
    )
    other = {**MACHINE, "threads": 4}
    forged = {"job_id": "someone-else", "source": "imported", "measured_at": "2001-01-01T00:00Z"}
    records = [
        VerdictRecord.from_dict(r)
        for r in (
            record(0, **forged),
            record(0, median=1.2, verdict="slower"),  # the same signature again: dropped
            record(1, machine=other),  # another machine class: dropped
            record(2, region={"ops": ["X"], "regions": ["y" * 70_000]}),  # oversized
            record(3, pattern="gelu"),
            record(4),
        )
    ]
    job = Job(id="job-a", tenant_id="acme")
    with session_scope(url) as session:
        stored = verdicts.record_job_verdicts(
            session, job, records, settings(tmp_path, verdicts_per_job_limit=2), machine_key=KEY
        )
    assert stored == 2 and hooked == [["conv_bn_relu", "gelu"]]
    with session_scope(url) as session:
        rows = session.scalars(select(Verdict).order_by(Verdict.id)).all()
        assert [r.signature for r in rows] == [records[0].signature, records[4].signature]
        for r in rows:
            assert (r.job_id, r.tenant_id, r.source) == ("job-a", "acme", "measured")
            when = (
                r.measured_at.replace(tzinfo=UTC) if r.measured_at.tzinfo is None else r.measured_at
            )
            assert abs(when - datetime.now(UTC)) < timedelta(minutes=1)  # not 2001
            assert (r.onnxruntime, r.cpu, r.median) == ("1.23.0", "Test CPU 9000", 0.9)


def _fresh(url: str, tmp_path: Path, tenant: str = "acme", host=None, **values) -> list:
    with session_scope(url) as session:
        return verdicts.fresh_for(
            session, host or MACHINE, tenant_id=tenant, settings=settings(tmp_path, **values)
        )


def test_a_job_reuses_fresh_verdicts_of_its_host(url, tmp_path):
    newer_ort = {**MACHINE, "onnxruntime": "1.24.0"}
    other_cpu = {**MACHINE, "cpu": "Other CPU"}
    with session_scope(url) as session:
        session.add_all(
            [
                row(0, job_id="job-a", tenant_id="acme", measured_at=NOW - timedelta(days=2)),
                row(1, job_id="job-b", tenant_id="globex", measured_at=NOW - timedelta(days=1)),
                row(2, tenant_id="acme", source="imported", measured_at=NOW - timedelta(days=3)),
                row(3, job_id="job-c", tenant_id="acme", measured_at=NOW - timedelta(days=40)),
                row(4, job_id="job-d", tenant_id="acme", machine=newer_ort),
                row(5, job_id="job-e", tenant_id="acme", machine=other_cpu),
            ]
        )
    fresh = _fresh(url, tmp_path)
    # newest first; too old, another onnxruntime, another CPU left out
    assert [r.signature for r in fresh] == [record(n)["signature"] for n in (1, 0, 2)]
    # the other tenant's job id is not handed to this tenant's sandbox (nor its report)
    assert [r.job_id for r in fresh] == [None, "job-a", None]
    assert all(isinstance(r, VerdictRecord) and r.ratio.median == 0.9 for r in fresh)
    assert [r.job_id for r in _fresh(url, tmp_path, tenant="globex")] == ["job-b", None, None]
    mine = _fresh(url, tmp_path, verdicts_shared=False)
    assert [r.signature for r in mine] == [record(n)["signature"] for n in (0, 2)]
    assert len(_fresh(url, tmp_path, verdict_max_age_days=60)) == 4
    assert len(_fresh(url, tmp_path, verdicts_prefetch_limit=1)) == 1
    assert _fresh(url, tmp_path, verdicts_prefetch_limit=0) == []
    assert [r.signature for r in _fresh(url, tmp_path, host=newer_ort)] == [record(4)["signature"]]


def test_a_verdict_dated_ahead_of_the_clock_is_not_reused(url, tmp_path):
    """An imported verdict whose measured_at lies far ahead (a wrong clock, an edited
    file) would pass every age limit until that day: it is not reused; one a few hours
    ahead (another machine's clock) still is."""
    now = datetime.now(UTC)
    with session_scope(url) as session:
        session.execute(delete(Verdict))
        session.add_all(
            [
                row(10, source="imported", measured_at=now + timedelta(hours=3)),
                row(11, source="imported", measured_at=now + timedelta(days=400)),
            ]
        )
    fresh = _fresh(url, tmp_path, verdict_max_age_days=36_500)
    assert [r.signature for r in fresh] == [record(10)["signature"]]


def _page(url, filters=None, size=None, token=None, viewer="acme", shared=True):
    with session_scope(url) as session:
        return list_verdicts(
            session, filters or verdicts.VerdictFilters(), size, token, viewer, shared=shared
        )


def test_listing_pages_with_tokens_and_filters(url):
    with session_scope(url) as session:
        for n in range(7):
            tenant = "acme" if n % 2 else "globex"
            when = NOW - timedelta(hours=n // 2)  # pairs share a moment: the id breaks ties
            session.add(row(n, job_id=f"job-{n}", tenant_id=tenant, measured_at=when))
    seen, token, pages = [], None, 0
    while True:
        page = _page(url, size=3, token=token)
        assert page.total == 7 and page.page_size == 3
        seen += [item["id"] for item in page.items]
        token, pages = page.next_page_token, pages + 1
        if token is None:
            break
    assert pages == 3 and len(seen) == len(set(seen)) == 7
    items = _page(url).items
    assert [i["signature"] for i in items][:1] == [record(1)["signature"]]  # newest, then by id
    for item in items:  # a foreign job's id is hidden; the verdict is not
        own = item["signature"] in {record(n)["signature"] for n in (1, 3, 5)}
        assert (item["job_id"] is not None, item["job_visible"]) == (own, own)
        assert VerdictRecord.from_dict({k: v for k, v in item.items() if k not in LISTED})
    assert _page(url, shared=False).total == 3


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        pytest.param({"pattern": "gelu"}, {1}, id="pattern"),
        pytest.param({"verdict": "slower"}, {2}, id="verdict"),
        pytest.param({"signature": record(0)["signature"]}, {0}, id="signature"),
        pytest.param({"machine_key": machine_key({**MACHINE, "threads": 2})}, {3}, id="machine"),
        pytest.param({"onnxruntime": "1.24.0"}, {4}, id="onnxruntime"),
        pytest.param({"cpu": "Other CPU"}, {5}, id="cpu"),
        pytest.param({"since": NOW - timedelta(days=1)}, {0, 1, 2, 3, 4, 5}, id="since"),
        pytest.param({"source": "imported"}, {6}, id="source"),
    ],
)
def test_each_filter(url, filters, expected):
    old = NOW - timedelta(days=5)
    with session_scope(url) as session:
        session.add_all(
            [
                row(0),
                row(1, pattern="gelu"),
                row(2, median=1.2, verdict="slower"),
                row(3, machine={**MACHINE, "threads": 2}),
                row(4, machine={**MACHINE, "onnxruntime": "1.24.0"}),
                row(5, machine={**MACHINE, "cpu": "Other CPU"}),
                row(6, source="imported", measured_at=old),
            ]
        )
    page = _page(url, verdicts.VerdictFilters(**filters))
    signatures = {record(n)["signature"]: n for n in range(7)}
    assert {signatures[i["signature"]] for i in page.items} == expected
    assert page.total == len(expected)


def test_a_page_token_is_checked(url):
    with session_scope(url) as session:
        session.add_all([row(n) for n in range(3)])
    token = _page(url, size=1).next_page_token
    assert token
    gelu = verdicts.VerdictFilters(pattern="gelu")
    for bad, filters in [(token, gelu), ("not-a-token", None), (token[:-4], None)]:
        with pytest.raises(ProblemError) as caught:
            _page(url, filters, size=1, token=bad)
        assert (caught.value.status, caught.value.slug) == (400, "invalid-page-token")


def test_import_skips_duplicates_and_invalid_records(url):
    good = [record(n, job_id="their-job", measured_at=NOW - timedelta(days=n)) for n in range(3)]
    bad = {**record(9), "ratio": {**record(9)["ratio"], "low": 5.0}}
    file = {"format": VERDICTS_FORMAT, "verdicts": [*good, good[0], bad, "nonsense"]}
    records, skipped = verdicts.parse_verdicts_file(file)
    assert len(records) == 4 and len(skipped) == 2
    assert skipped[0].startswith("verdict 4: ratio must have") and "verdict 5:" in skipped[1]
    with session_scope(url) as session:
        first = verdicts.import_verdicts(session, records, "acme")
    assert (first.imported, first.duplicates) == (3, 1)  # good[0] twice in the file
    with session_scope(url) as session:
        again = verdicts.import_verdicts(session, records, "acme")
    assert (again.imported, again.duplicates) == (0, 4)
    with session_scope(url) as session:
        rows = session.scalars(select(Verdict)).all()
        assert {(r.job_id, r.tenant_id, r.source) for r in rows} == {(None, "acme", "imported")}
        kept = sorted(verdicts.verdict_dict(r, job_id=None)["measured_at"] for r in rows)
    assert kept == sorted(g["measured_at"] for g in good)  # their age counts from measuring


@pytest.mark.parametrize(
    "body",
    [
        pytest.param([], id="a-list"),
        pytest.param({"format": "other/1", "verdicts": []}, id="another-format"),
        pytest.param({"format": VERDICTS_FORMAT, "verdicts": {}}, id="verdicts-not-a-list"),
        pytest.param({"format": VERDICTS_FORMAT, "verdicts": [{"pattern": "x"}]}, id="none-valid"),
    ],
)
def test_a_file_that_is_not_a_verdicts_file_is_a_422(body):
    with pytest.raises(ProblemError) as caught:
        verdicts.parse_verdicts_file(body)
    assert (caught.value.status, caught.value.slug) == (422, "invalid-verdicts-file")
    if isinstance(body, dict) and body["verdicts"]:
        assert "verdict 0: signature must be 64 lowercase hex digits" in caught.value.detail


def test_an_export_imports_into_another_store(url, tmp_path):
    with session_scope(url) as session:
        session.add_all(
            [
                row(0, job_id="job-a", tenant_id="acme"),
                row(1, job_id="job-b", tenant_id="globex", measured_at=NOW - timedelta(days=1)),
                row(2, pattern="gelu", tenant_id="acme", measured_at=NOW - timedelta(days=2)),
            ]
        )
    with session_scope(url) as session:
        everything = verdicts.VerdictFilters()
        exported = verdicts.export_verdicts(session, everything, viewer_tenant="acme")
        one = verdicts.export_verdicts(session, everything, viewer_tenant="acme", limit=1)
        gelu = verdicts.VerdictFilters(pattern="gelu")
        only_gelu = verdicts.export_verdicts(session, gelu, viewer_tenant="acme")
    assert exported["format"] == VERDICTS_FORMAT and exported["total"] == 3
    assert [v["job_id"] for v in exported["verdicts"]] == ["job-a", None, None]
    assert (len(one["verdicts"]), one["total"]) == (1, 3)
    assert [v["pattern"] for v in only_gelu["verdicts"]] == ["gelu"]
    other = f"sqlite:///{tmp_path / 'other.db'}"
    upgrade(other)
    records, skipped = verdicts.parse_verdicts_file(exported)
    with session_scope(other) as session:
        counts = verdicts.import_verdicts(session, records, "ops")
    assert (counts.imported, counts.duplicates, skipped) == (3, 0, [])
    with session_scope(other) as session:
        again = verdicts.export_verdicts(session, everything, viewer_tenant="ops")
    strip = ("job_id", "source")
    assert [{k: v for k, v in d.items() if k not in strip} for d in again["verdicts"]] == [
        {k: v for k, v in d.items() if k not in strip} for d in exported["verdicts"]
    ]
