"""The verdict store, a page at a time (``GET /v1/verdicts``), as the jobs are listed
(``app/services/job_pages.py``, AIP-158): keyset pages over a stable order.

The order is ``(measured_at, id)``, newest first (``id`` breaks ties), so a verdict
stored between two reads never puts another on two pages. A page token is the last
row's key with the filters it was issued for (a digest), as URL-safe base64 of a small
JSON document: opaque to clients, validated, not signed (it only says where to start in
a list the viewer may read whole); a token this server did not issue, or sent with
other filters, is ``400 invalid-page-token``.

Each item is the verdict's file form (``VerdictRecord.to_dict``) with its ``id``;
``job_id`` only for a job of the viewer's own tenant (``job_visible``): verdicts are
shared, jobs are not.
"""

from __future__ import annotations

import binascii
import hashlib
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, or_, select
from sqlalchemy.orm import Session

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import Verdict, as_utc
from autofusion.app.services.job_pages import (
    invalid_page_token,
    pack_token,
    page_size_of,
    unpack_token,
)
from autofusion.app.services.verdicts import VerdictFilters, shown_job_id, verdict_dict

__all__ = ["VerdictPage", "list_verdicts"]

_TOKEN_VERSION = 1


@dataclass
class VerdictPage:
    items: list[dict[str, Any]]
    total: int  # the verdicts that match the filters, on every page
    page_size: int
    next_page_token: str | None  # None on the last page


def _digest(filters: VerdictFilters) -> str:
    text = json.dumps(filters.to_dict(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _encode(row: Verdict, filters: VerdictFilters) -> str:
    when = as_utc(row.measured_at).isoformat()
    document = {"v": _TOKEN_VERSION, "m": when, "i": row.id, "f": _digest(filters)}
    return pack_token(document)


def _invalid(detail: str) -> ProblemError:
    return invalid_page_token(detail, same="with the same filters, ")


def _decode(token: str, filters: VerdictFilters) -> tuple[datetime, int]:
    try:
        document = unpack_token(token)
        if not isinstance(document, dict) or document.get("v") != _TOKEN_VERSION:
            raise ValueError("not a page token of this version")
        when = datetime.fromisoformat(document["m"])  # TypeError if not a string
        row_id, issued_for = document["i"], document["f"]
        if when.tzinfo is None or isinstance(row_id, bool) or not isinstance(row_id, int):
            raise ValueError("not a key")
    except (ValueError, TypeError, KeyError, binascii.Error):
        raise _invalid("page_token is not a token this server issued") from None
    if issued_for != _digest(filters):
        raise _invalid("page_token was issued for other filters")
    return as_utc(when), row_id


def list_verdicts(
    session: Session,
    filters: VerdictFilters,
    page_size: int | None,
    page_token: str | None,
    viewer_tenant: str,
    *,
    shared: bool = True,
) -> VerdictPage:
    """One page of the verdicts matching ``filters``, newest measurement first (without
    ``shared``, only those of the viewer's own tenant's jobs and imports)."""
    size = page_size_of(page_size)
    where = filters.where(viewer_tenant=viewer_tenant, shared=shared)
    total = session.scalar(select(func.count()).select_from(Verdict).where(*where)) or 0
    if page_token:
        when, row_id = _decode(page_token, filters)
        where.append(
            or_(
                Verdict.measured_at < when,
                and_(Verdict.measured_at == when, Verdict.id < row_id),
            )
        )
    query = select(Verdict).where(*where).order_by(Verdict.measured_at.desc(), Verdict.id.desc())
    rows = list(session.scalars(query.limit(size + 1)))
    page = rows[:size]
    token = _encode(page[-1], filters) if len(rows) > size else None
    items = []
    for row in page:
        job_id = shown_job_id(row, viewer_tenant)
        item = verdict_dict(row, job_id=job_id)
        items.append({"id": row.id, **item, "job_visible": job_id is not None})
    return VerdictPage(items, total, size, token)
