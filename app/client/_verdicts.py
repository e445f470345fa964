"""The verdict store over HTTP (``GET /v1/verdicts``, ``/v1/verdicts/export``,
``POST /v1/verdicts/import``), for the typed client and ``autofusion verdicts``.

An import is sent in parts of ``IMPORT_BATCH`` verdicts: a request body is bounded by
the server's ``max_form_bytes`` (4 MiB by default), an export of a busy server is not.
Each part is idempotent on the server (a verdict already stored is a duplicate), so a
retried or repeated import stores nothing twice.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from autofusion.app.client._errors import RequestRefused
from autofusion.app.client._http import Transport, read_json

__all__ = [
    "IMPORT_BATCH",
    "VERDICT_FILTERS",
    "export_verdicts",
    "import_verdicts",
    "list_verdicts",
    "verdicts_query",
]

# The query parameters both the listing and the export take.
VERDICT_FILTERS = (
    "pattern", "verdict", "signature", "machine_key", "onnxruntime", "cpu", "since", "source",
)  # fmt: skip
IMPORT_BATCH = 500  # verdicts of a few kilobytes each: a part stays well under 4 MiB
_NUMBERED = re.compile(r"^verdict (\d+):")


def verdicts_query(filters: Mapping[str, Any], **more: Any) -> dict[str, Any]:
    """The query parameters: the filters given (a ``since`` datetime as ISO 8601)."""
    unknown = sorted(set(filters) - set(VERDICT_FILTERS))
    if unknown:
        known = ", ".join(VERDICT_FILTERS)
        raise ValueError(f"unknown verdict filters {unknown}; the filters are {known}")
    params = {**filters, **more}
    return {
        name: value.isoformat() if isinstance(value, datetime) else value
        for name, value in params.items()
        if value is not None
    }


def list_verdicts(transport: Transport, params: Mapping[str, Any]) -> dict:
    """One page: ``items``, ``total``, ``page_size``, ``next_page_token``."""
    return read_json(transport.send("GET", "/v1/verdicts", params=dict(params)))


def export_verdicts(transport: Transport, params: Mapping[str, Any]) -> dict:
    """The verdicts file of the filtered set (the newest, up to ``limit``)."""
    return read_json(transport.send("GET", "/v1/verdicts/export", params=dict(params)))


def import_verdicts(
    transport: Transport, document: Mapping[str, Any], *, batch: int = IMPORT_BATCH
) -> dict[str, Any]:
    """Send a verdicts file in parts; the counts of all of them: ``imported``,
    ``duplicates``, ``skipped`` (why, numbered as in the file). A part whose every
    verdict is invalid counts as skipped; ``RequestRefused`` (422) when every part was
    refused: the file is not a verdicts file, or holds no valid verdict."""
    items = document.get("verdicts")
    if not isinstance(items, list) or len(items) <= batch:
        answer = _send(transport, dict(document))
        return {**answer, "skipped": list(answer.get("skipped") or [])}
    totals: dict[str, Any] = {"imported": 0, "duplicates": 0, "skipped": []}
    refused: list[RequestRefused] = []
    starts = range(0, len(items), batch)
    for start in starts:
        part = {"format": document.get("format"), "verdicts": items[start : start + batch]}
        try:
            answer = _send(transport, part)
        except RequestRefused as exc:
            if exc.status != 422:
                raise
            refused.append(exc)
            end = start + len(part["verdicts"]) - 1
            totals["skipped"].append(f"verdicts {start} to {end}: {exc.detail}")
            continue
        totals["imported"] += int(answer.get("imported") or 0)
        totals["duplicates"] += int(answer.get("duplicates") or 0)
        totals["skipped"] += [_renumbered(r, start) for r in answer.get("skipped") or []]
    if len(refused) == len(starts):
        raise refused[0]
    return totals


def _send(transport: Transport, body: dict[str, Any]) -> dict:
    return read_json(transport.send("POST", "/v1/verdicts/import", json=body))


def _renumbered(reason: Any, offset: int) -> str:
    """The server numbers a part's verdicts from 0: as in the whole file instead."""
    return _NUMBERED.sub(lambda m: f"verdict {int(m.group(1)) + offset}:", str(reason))
