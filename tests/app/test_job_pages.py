"""Paging through GET /v1/jobs with page tokens (AIP-158; app/services/job_pages.py).

Keyset pages over (created_at, id), newest first: jobs submitted between two reads never
put a job on two pages nor hide one, also when many share one created_at; a forged token
is a 400 problem; the total is one COUNT(*). Before: offset pages, the same job on two
pages after a submit, and the total counted by loading every id.
"""

from __future__ import annotations

import base64
import json
import re
import uuid
from datetime import UTC, datetime

import pytest
from sqlalchemy import event

from autofusion.app.core.db import get_engine
from autofusion.app.core.models import Job
from autofusion.app.services.auth import ensure_tenant

MOMENT = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def _insert(service, count: int, created_at: datetime | None = None) -> list[str]:
    """Jobs of the default tenant written straight to the table (created_at chosen)."""
    ids = [str(uuid.uuid4()) for _ in range(count)]
    with service.db() as session:
        ensure_tenant(session, "default")
        for job_id in ids:
            job = Job(id=job_id, tenant_id="default", model_digest="0" * 64, request_hash="")
            if created_at is not None:
                job.created_at = job.updated_at = created_at
            session.add(job)
    return ids


def _pages(service, page_size: int, between=None, **params) -> list[list[str]]:
    """Every page, following next_page_token; ``between()`` runs after each read."""
    pages, token = [], None
    while True:
        query = {"page_size": page_size, **params, **({"page_token": token} if token else {})}
        response = service.client.get("/v1/jobs", params=query)
        assert response.status_code == 200, response.text
        body = response.json()
        pages.append([job["id"] for job in body["items"]])
        token = body["next_page_token"]
        if token is None:
            return pages
        assert len(pages) < 100, "the pages never end"
        if between is not None:
            between()


def _flat(pages: list[list[str]]) -> list[str]:
    return [job_id for page in pages for job_id in page]


def test_jobs_submitted_between_two_reads_never_shift_a_page(service, tiny_model):
    before = [service.submit(tiny_model).json()["id"] for _ in range(7)]
    submitted = []

    def submit_two() -> None:
        submitted.extend(service.submit(tiny_model).json()["id"] for _ in range(2))

    pages = _pages(service, 3, between=submit_two)
    seen = _flat(pages)
    assert len(seen) == len(set(seen)), pages  # no job on two pages
    assert seen == before[::-1], pages  # each earlier job once, newest first
    assert not set(submitted) & set(seen)  # the new ones are ahead of the first page
    assert service.client.get("/v1/jobs").json()["total"] == 7 + len(submitted)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_jobs_of_one_created_at_page_by_id_with_inserts_between_reads(
    make_service, database, request
):
    options = {}
    if database == "postgresql":
        options["database_url"] = request.getfixturevalue("postgres_url")
    service = make_service(**options)
    existing = _insert(service, 9, MOMENT)
    added: list[str] = []

    def insert_same_moment() -> None:  # ids random: some sort before the page's end
        added.extend(_insert(service, 2, MOMENT))

    seen = _flat(_pages(service, 2, between=insert_same_moment))
    assert len(seen) == len(set(seen)), seen  # no job twice
    assert set(existing) <= set(seen)  # none of those there at the first read is hidden
    assert [j for j in seen if j in existing] == sorted(existing, reverse=True)
    assert set(seen) <= set(existing) | set(added)


def _rows(html: str) -> list[str]:
    return re.findall(r'<tr data-job-id="([^"]+)"', html)


def _link(html: str, link_id: str) -> str:
    return html.split(f'id="{link_id}" href="')[1].split('"')[0].replace("&amp;", "&")


def test_the_dashboard_pages_by_the_same_tokens(service, tiny_model):
    ids = _insert(service, 25)  # created one after another: newest last
    first = service.client.get("/ui/jobs").text
    older = _link(first, "next-page")
    _insert(service, 3)  # submitted before the next read
    second = service.client.get(older).text
    assert _rows(second) == ids[::-1][20:]  # the 5 oldest: nothing shifted
    newer = _link(second, "prev-page")
    back = service.client.get(newer).text
    assert _rows(back) == ids[::-1][:20]


def _token(document: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(document).encode()).decode().rstrip("=")


GOOD = {"v": 1, "c": MOMENT.isoformat(), "i": str(uuid.uuid4()), "s": None, "n": False}
FORGED = [
    "garbage",
    "!!!",
    base64.urlsafe_b64encode(b"not json").decode(),
    _token([1, 2]),
    _token({**GOOD, "v": 2}),
    _token({**GOOD, "c": "yesterday"}),
    _token({**GOOD, "c": "2026-01-02T03:04:05"}),  # no time zone
    _token({**GOOD, "c": 12}),
    _token({**GOOD, "i": ""}),
    _token({**GOOD, "i": "x" * 65}),
    _token({**GOOD, "n": "yes"}),
    _token({**GOOD, "s": "done"}),
    _token({key: value for key, value in GOOD.items() if key != "i"}),
]


@pytest.mark.parametrize("token", FORGED)
def test_a_forged_page_token_is_a_400_problem(service, problem, token):
    body = problem(
        service.client.get("/v1/jobs", params={"page_token": token}), 400, "invalid-page-token"
    )
    assert "page_token" in body["detail"]


def test_a_token_is_valid_only_with_the_filter_it_was_issued_for(service, problem):
    _insert(service, 3)
    first = service.client.get("/v1/jobs", params={"page_size": 1, "status": "queued"}).json()
    token = first["next_page_token"]
    again = {"page_token": token, "status": "queued", "page_size": 1}
    ok = service.client.get("/v1/jobs", params=again)
    assert ok.status_code == 200 and len(ok.json()["items"]) == 1
    body = problem(
        service.client.get("/v1/jobs", params={"page_token": token}), 400, "invalid-page-token"
    )
    assert "status=queued" in body["detail"]
    both = service.client.get("/v1/jobs", params={"page_token": token, "offset": 1})
    problem(both, 422, "invalid-request")


def test_the_total_is_one_count_not_every_id(service):
    _insert(service, 30)
    engine = get_engine(service.settings.resolved_database_url)
    statements: list[str] = []

    def record(_conn, _cursor, statement, *_args) -> None:
        statements.append(statement.lower())

    event.listen(engine, "before_cursor_execute", record)
    try:
        body = service.client.get("/v1/jobs", params={"page_size": 5}).json()
    finally:
        event.remove(engine, "before_cursor_execute", record)
    assert body["total"] == 30 and len(body["items"]) == 5
    jobs = [s for s in statements if "from jobs" in s]
    assert sum("count(*)" in s for s in jobs) == 1, jobs
    # Every other read of the table is limited to one page (and one row to look ahead).
    assert all("count(*)" in s or "limit" in s for s in jobs), jobs
