"""A tenant's jobs, a page at a time (AIP-158): keyset pages over a stable order.

The order is ``(created_at, id)``, newest first: ``id`` breaks ties between jobs created
in the same microsecond, so the order is total. A page ends at a key (the last job's
``created_at`` and ``id``) and the next page starts strictly after it, so a job submitted
between two reads lands before the first page and never pushes a job already shown onto
the next page (an offset would: the same job twice, and one never). The total is one
``COUNT(*)``.

A page token is that key, with the filter it was issued for, as URL-safe base64 of a
small JSON document. It is opaque to clients, and validated, not signed: a token only
says where to start in the tenant's own list (every query is scoped to the tenant), so a
forged one can show nothing that a first page could not. Anything that does not decode
to such a key is a ``400 invalid-page-token``.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import Job, JobStatus, as_utc

__all__ = [
    "PAGE_SIZE_DEFAULT",
    "PAGE_SIZE_MAX",
    "JobPage",
    "PageKey",
    "decode_page_token",
    "encode_page_token",
    "invalid_page_token",
    "list_jobs",
    "pack_token",
    "page_size_of",
    "unpack_token",
]

PAGE_SIZE_DEFAULT = 50
PAGE_SIZE_MAX = 200
_TOKEN_VERSION = 1
_MAX_ID = 64


@dataclass(frozen=True)
class PageKey:
    """Where a page starts: just after (older than) this job, or with ``newer`` just
    before it (the dashboard's "newer" link)."""

    created_at: datetime
    id: str
    newer: bool = False


@dataclass
class JobPage:
    jobs: list[Job]
    total: int  # the tenant's jobs that match the filter, on every page
    older: PageKey | None  # where the next page starts; None on the last page
    newer: PageKey | None  # where the page before starts; None on the first page


def page_size_of(requested: int | None) -> int:
    """0 or absent: the default; above the maximum: the maximum (AIP-158)."""
    if not requested:
        return PAGE_SIZE_DEFAULT
    return min(requested, PAGE_SIZE_MAX)


def encode_page_token(key: PageKey, status: str | None) -> str:
    document = {
        "v": _TOKEN_VERSION,
        "c": as_utc(key.created_at).isoformat(),
        "i": key.id,
        "s": status,
        "n": key.newer,
    }
    return pack_token(document)


def pack_token(document: dict[str, Any]) -> str:
    """A page token: the document as URL-safe base64 of compact JSON (every listing's)."""
    raw = json.dumps(document, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def unpack_token(token: str) -> Any:
    """The document of ``pack_token``; ValueError or binascii.Error for anything else."""
    return json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))


def invalid_page_token(detail: str, *, same: str = "") -> ProblemError:
    """400 invalid-page-token: what was wrong and what to send (``same``: what else must
    stay as it was, e.g. "with the same filters, ")."""
    return ProblemError(
        400,
        "invalid-page-token",
        "Invalid page token",
        f"{detail}; send the next_page_token of the previous page as it came, {same}or "
        "leave page_token out for the first page",
    )


def decode_page_token(token: str, status: str | None) -> PageKey:
    """The key in ``token``; 400 for anything else, or for a token of another filter."""
    try:
        key, issued_for = _read_token(token)
    except (ValueError, TypeError, KeyError, binascii.Error):
        raise invalid_page_token("page_token is not a token this server issued") from None
    if issued_for != status:
        raise invalid_page_token(
            f"page_token was issued for status={issued_for or '(any)'}, "
            f"not status={status or '(any)'}"
        )
    return key


def _read_token(token: str) -> tuple[PageKey, str | None]:
    document = unpack_token(token)
    if not isinstance(document, dict) or document.get("v") != _TOKEN_VERSION:
        raise ValueError("not a page token of this version")
    created_at, job_id, newer, issued_for = (
        document["c"],
        document["i"],
        document["n"],
        document["s"],
    )
    when = datetime.fromisoformat(created_at)  # TypeError if not a string
    if when.tzinfo is None or not isinstance(newer, bool):
        raise ValueError("not a key")
    if not isinstance(job_id, str) or not 0 < len(job_id) <= _MAX_ID:
        raise ValueError("not a job id")
    if issued_for is not None and issued_for not in JobStatus.__members__:
        raise ValueError("not a status")
    return PageKey(as_utc(when), job_id, newer), issued_for


def _after(key: PageKey):
    """Older than ``key`` in the order (created_at desc, id desc)."""
    return or_(
        Job.created_at < key.created_at,
        and_(Job.created_at == key.created_at, Job.id < key.id),
    )


def _before(key: PageKey):
    return or_(
        Job.created_at > key.created_at,
        and_(Job.created_at == key.created_at, Job.id > key.id),
    )


def _key(job: Job, *, newer: bool = False) -> PageKey:
    return PageKey(as_utc(job.created_at), job.id, newer)


def list_jobs(
    session: Session,
    tenant_id: str,
    *,
    status: str | None,
    page_size: int,
    key: PageKey | None = None,
    offset: int | None = None,
) -> JobPage:
    """One page of the tenant's jobs, newest first, starting at ``key`` (or, deprecated,
    ``offset`` rows in: the same order, but not stable under inserts)."""
    where = [Job.tenant_id == tenant_id] + ([Job.status == status] if status else [])
    total = session.scalar(select(func.count()).select_from(Job).where(*where)) or 0
    newest_first = (Job.created_at.desc(), Job.id.desc())
    if key is not None and key.newer:
        query = select(Job).where(*where, _before(key))
        rows = list(session.scalars(query.order_by(Job.created_at, Job.id).limit(page_size + 1)))
        more = len(rows) > page_size
        jobs = rows[:page_size][::-1]
        newer = _key(jobs[0], newer=True) if more and jobs else None
        return JobPage(jobs, total, older=_key(jobs[-1]) if jobs else None, newer=newer)
    query = select(Job).where(*where, *([_after(key)] if key is not None else []))
    query = query.order_by(*newest_first).limit(page_size + 1).offset(offset or None)
    rows = list(session.scalars(query))
    jobs = rows[:page_size]
    older = _key(jobs[-1]) if len(rows) > page_size else None
    started_inside = key is not None or bool(offset)
    newer = _key(jobs[0], newer=True) if started_inside and jobs else None
    return JobPage(jobs, total, older=older, newer=newer)
