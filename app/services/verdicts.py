"""The verdict store (issue 28): what measured selection learned, kept in the database and
shared by every worker.

A verdict is one measured decision on a group of fusions (``fusion_core``'s
``VerdictRecord``: a region signature, a machine class, a paired ratio). The flow:

1. ``fresh_for``: before a measured job's sandbox starts, the worker writes the verdicts
   this host may reuse into the job's folder (same CPU and onnxruntime, measured within
   ``verdict_max_age_days``, the job's own tenant only unless ``verdicts_shared``);
   measured selection decides the groups a confident combination of them covers
   without timing, and times the rest.
2. ``record_job_verdicts``: after the job succeeds, the verdicts it measured are stored.
   The sandbox ran a user's model, so its file is not trusted for who measured: the job
   id, tenant, source and time are set here, records of another machine class are
   dropped, one record per signature is kept and at most ``verdicts_per_job_limit``.
   Rows are never overwritten: readers combine them (``combine_verdicts``), so a
   contradicting measurement widens the evidence instead of flipping it.
3. ``export_verdicts`` / ``import_verdicts``: the file format
   (``{"format": "autofusion-verdicts/1", "verdicts": [...]}``) that seeds a new server.

Verdicts are shared across tenants, jobs are not: wherever a row leaves the store (a
listing, an export, a sandbox's input) its job id is shown only to the job's own tenant.
``app/services/verdict_pages.py`` lists them a page at a time.

The records are ``fusion_core.profiling.verdicts``'s, a light module (no onnx, no onnxruntime:
the API process lists, exports and imports them without loading the pipeline,
tests/app/test_api_imports.py).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import Job, Verdict, as_utc, utcnow
from autofusion.app.services.pattern_class_rules import apply_auto_disable
from autofusion.fusion_core.profiling.stats import VERDICTS, PairedRatio
from autofusion.fusion_core.profiling.verdicts import (
    CLOCK_SKEW,
    VERDICTS_FORMAT,
    VerdictRecord,
    parse_verdicts,
)

__all__ = [
    "EXPORT_LIMIT",
    "FILE_FORMAT",
    "MAX_RECORD_BYTES",
    "SOURCES",
    "VERDICTS",
    "ImportCounts",
    "VerdictFilters",
    "export_verdicts",
    "fresh_for",
    "import_verdicts",
    "new_row",
    "parse_verdicts_file",
    "record_job_verdicts",
    "shown_job_id",
    "storable",
    "verdict_dict",
]

logger = logging.getLogger(__name__)

FILE_FORMAT = VERDICTS_FORMAT
# The most verdicts one export holds (the newest of the filtered set).
EXPORT_LIMIT = 50_000
# A record larger than this as JSON is not stored: a region is a few op types and shape
# classes; anything bigger did not come from measured selection.
MAX_RECORD_BYTES = 64 * 1024
_IN_CHUNK = 500  # values per IN (...) when looking for duplicates


@dataclass(frozen=True)
class VerdictFilters:
    """What a listing or an export asks for; None: any."""

    pattern: str | None = None
    verdict: str | None = None  # faster, no measurable change, slower
    signature: str | None = None
    machine_key: str | None = None
    onnxruntime: str | None = None
    cpu: str | None = None
    since: datetime | None = None  # measured at or after
    source: str | None = None  # measured, imported

    def where(self, *, viewer_tenant: str | None, shared: bool) -> list[Any]:
        """The SQL conditions; without ``shared``, the viewer's own tenant's rows only."""
        where: list[Any] = [
            getattr(Verdict, name) == getattr(self, name)
            for name in _EQUAL
            if getattr(self, name) is not None
        ]
        if self.since is not None:
            where.append(Verdict.measured_at >= as_utc(self.since))
        if not shared:
            where.append(Verdict.tenant_id == viewer_tenant)
        return where

    def to_dict(self) -> dict[str, str]:
        """The filters set, as text (what a page token is issued for)."""
        values = {name: getattr(self, name) for name in (*_EQUAL, "since")}
        if self.since is not None:
            values["since"] = as_utc(self.since).isoformat()
        return {name: str(value) for name, value in values.items() if value is not None}


_EQUAL = ("pattern", "verdict", "signature", "machine_key", "onnxruntime", "cpu", "source")
SOURCES = ("measured", "imported")


def shown_job_id(row: Verdict, viewer_tenant: str | None) -> str | None:
    """The row's job id for ``viewer_tenant``: only a job of its own (verdicts are
    shared, jobs are not)."""
    if row.job_id is None or viewer_tenant is None or row.tenant_id != viewer_tenant:
        return None
    return row.job_id


def verdict_dict(row: Verdict, *, job_id: str | None) -> dict[str, Any]:
    """The row in the file form (``VerdictRecord.to_dict``), with ``job_id`` as given."""
    return {
        "signature": row.signature,
        "pattern": row.pattern,
        "pattern_hash": row.pattern_hash,
        "group": row.group_key,
        "region": row.region,
        "machine_key": row.machine_key,
        "machine": row.machine,
        "target": row.target,
        "ratio": {
            "median": row.median,
            "low": row.low,
            "high": row.high,
            "confidence": row.confidence,
            "runs": row.runs,
            "verdict": row.verdict,
        },
        "measured_at": as_utc(row.measured_at).isoformat(),
        "with_ms": row.with_ms,
        "predicted": row.predicted,
        "job_id": job_id,
        "source": row.source,
    }


def new_row(record: VerdictRecord, **fields: Any) -> Verdict:
    """A new row of ``record``; ``fields`` (job_id, tenant_id, source, measured_at) win."""
    machine = record.machine
    values: dict[str, Any] = {
        "signature": record.signature,
        "pattern": record.pattern[:200],
        "pattern_hash": record.pattern_hash,
        "group_key": record.group,
        "region": record.region,
        "machine_key": record.machine_key,
        "machine": machine,
        "onnxruntime": str(machine.get("onnxruntime", ""))[:40],
        "cpu": str(machine.get("cpu", ""))[:200],
        "target": record.target[:40],
        "median": record.ratio.median,
        "low": record.ratio.low,
        "high": record.ratio.high,
        "confidence": record.ratio.confidence,
        "runs": record.ratio.runs,
        "verdict": record.ratio.verdict,
        "with_ms": record.with_ms,
        "predicted": record.predicted,
        "measured_at": as_utc(record.when),
        "job_id": record.job_id,
        "source": record.source,
        **fields,
    }
    return Verdict(**values)


def _too_large(record: VerdictRecord) -> bool:
    return len(json.dumps(record.to_dict(), default=str)) > MAX_RECORD_BYTES


def record_job_verdicts(
    session: Session,
    job: Job,
    records: Sequence[VerdictRecord],
    settings: Settings,
    *,
    machine_key: str | None = None,
) -> int:
    """Store the verdicts ``job`` measured (``records``: the valid ones of its sandbox's
    output, as ``read_verdicts`` read them) and run the registry's hook on their
    patterns; returns how many were stored. ``machine_key``: the class the worker
    measured under; a record of another class is dropped (the sandbox does not choose
    which machines its verdicts describe). Flushes; the caller commits."""
    kept = storable(job.id, records, machine_key, settings.verdicts_per_job_limit)
    now = utcnow()  # the measurement's time is the worker's, not the file's
    session.add_all(
        new_row(r, job_id=job.id, tenant_id=job.tenant_id, source="measured", measured_at=now)
        for r in kept
    )
    session.flush()
    if kept:  # the registry's hook: patterns measured slower here, disabled here
        apply_auto_disable(session, settings, sorted({r.pattern for r in kept}), now=now)
    return len(kept)


def storable(
    job_id: str, records: Sequence[VerdictRecord], machine_key: str | None, limit: int
) -> list[VerdictRecord]:
    """The records a job may store: of ``machine_key`` (when given), one per signature
    (a job cannot outvote the others with copies of one measurement), none over
    ``MAX_RECORD_BYTES``, at most ``limit``."""
    kept: list[VerdictRecord] = []
    seen: set[tuple[str, str]] = set()
    for record in records:
        key = (record.signature, record.machine_key)
        if machine_key is not None and record.machine_key != machine_key:
            logger.warning("job %s: a verdict of another machine class dropped", job_id)
        elif _too_large(record):
            logger.warning("job %s: a verdict over %d bytes dropped", job_id, MAX_RECORD_BYTES)
        elif key not in seen:
            seen.add(key)
            kept.append(record)
    if len(kept) > limit:
        logger.warning(
            "job %s: %d verdicts, the first %d stored (verdicts_per_job_limit)",
            job_id,
            len(kept),
            limit,
        )
    return kept[:limit]


def fresh_for(
    session: Session, host: Mapping[str, Any], *, tenant_id: str, settings: Settings
) -> list[VerdictRecord]:
    """The verdicts a job of ``tenant_id`` may reuse on ``host`` (``host_class()``): the
    same onnxruntime and CPU, measured within ``verdict_max_age_days`` (and not dated
    more than ``CLOCK_SKEW`` ahead), of the tenant's
    own jobs only unless ``verdicts_shared``; newest first, at most
    ``verdicts_prefetch_limit``. Another tenant's job id is left out of each record."""
    limit = settings.verdicts_prefetch_limit
    if limit <= 0:
        return []
    now = utcnow()
    since = now - timedelta(days=settings.verdict_max_age_days)
    where = [
        Verdict.onnxruntime == str(host.get("onnxruntime", "")),
        Verdict.cpu == str(host.get("cpu", "")),
        Verdict.measured_at >= since,
        # an imported record dated ahead of the clock would never age out
        Verdict.measured_at <= now + CLOCK_SKEW,
    ]
    if not settings.verdicts_shared:
        where.append(Verdict.tenant_id == tenant_id)
    query = select(Verdict).where(*where).order_by(Verdict.measured_at.desc(), Verdict.id.desc())
    rows = session.scalars(query.limit(limit))
    return [_record(row, job_id=shown_job_id(row, tenant_id)) for row in rows]


def _record(row: Verdict, *, job_id: str | None) -> VerdictRecord:
    """A stored row as fusion_core's record (valid when stored: not validated again)."""
    return VerdictRecord(
        signature=row.signature,
        pattern=row.pattern,
        pattern_hash=row.pattern_hash,
        group=row.group_key,
        region=dict(row.region or {}),
        machine_key=row.machine_key,
        machine=dict(row.machine or {}),
        target=row.target,
        ratio=PairedRatio(row.median, row.low, row.high, row.confidence, row.runs, row.verdict),
        measured_at=as_utc(row.measured_at).isoformat(),
        with_ms=row.with_ms,
        predicted=row.predicted,
        job_id=job_id,
        source=row.source,
    )


def parse_verdicts_file(data: Any) -> tuple[list[VerdictRecord], list[str]]:
    """The valid records of a verdicts file's content, and a line per record left out
    (why). 422 when it is not a verdicts file at all, or when none of its records is
    valid (naming the first that is not)."""
    try:
        records, skipped = parse_verdicts(data)
    except ValueError as exc:
        raise ProblemError(
            422, "invalid-verdicts-file", "Not a verdicts file", f"the body {exc}"
        ) from None
    items = data["verdicts"]
    if items and not records:
        raise ProblemError(
            422,
            "invalid-verdicts-file",
            "No valid verdict",
            f"none of the file's {len(items)} verdicts is valid; the first: {skipped[0]}",
            skipped=skipped[:20],
        )
    return records, skipped


@dataclass
class ImportCounts:
    imported: int = 0
    duplicates: int = 0  # already stored (or twice in the file)
    skipped: list[str] = field(default_factory=list)  # invalid records: why

    def to_dict(self) -> dict[str, Any]:
        return {"imported": self.imported, "duplicates": self.duplicates, "skipped": self.skipped}


_Key = tuple[str, str, datetime, float, int]


def _key(signature: str, machine: str, when: datetime, median: float, runs: int) -> _Key:
    return (signature, machine, as_utc(when), median, runs)


def _stored_keys(session: Session, signatures: Iterable[str]) -> set[_Key]:
    """The duplicate keys of the rows of these signatures."""
    found: set[_Key] = set()
    wanted = sorted(set(signatures))
    for start in range(0, len(wanted), _IN_CHUNK):
        chunk = wanted[start : start + _IN_CHUNK]
        columns = (Verdict.signature, Verdict.machine_key, Verdict.measured_at)
        query = select(*columns, Verdict.median, Verdict.runs).where(Verdict.signature.in_(chunk))
        found |= {_key(*row) for row in session.execute(query)}
    return found


def import_verdicts(
    session: Session, records: Sequence[VerdictRecord], tenant_id: str
) -> ImportCounts:
    """Store ``records`` as ``source="imported"`` of ``tenant_id`` (no job; their
    ``measured_at`` kept, so their age counts from the measurement). A record already
    stored (the same signature, machine class, time, median and runs) is a duplicate,
    not stored twice: importing one file twice stores it once. Flushes."""
    counts = ImportCounts()
    known = _stored_keys(session, (r.signature for r in records))
    for record in records:
        r = record.ratio
        key = _key(record.signature, record.machine_key, record.when, r.median, r.runs)
        if key in known:
            counts.duplicates += 1
            continue
        if _too_large(record):
            counts.skipped.append(f"{record.group}: larger than {MAX_RECORD_BYTES} bytes")
            continue
        known.add(key)
        session.add(new_row(record, job_id=None, tenant_id=tenant_id, source="imported"))
        counts.imported += 1
    session.flush()
    return counts


def export_verdicts(
    session: Session,
    filters: VerdictFilters,
    *,
    viewer_tenant: str | None,
    shared: bool = True,
    limit: int = EXPORT_LIMIT,
) -> dict[str, Any]:
    """The newest ``limit`` verdicts that match ``filters`` as a verdicts file (job ids
    shown for the viewer's own jobs only), and ``total``: how many matched."""
    where = filters.where(viewer_tenant=viewer_tenant, shared=shared)
    total = session.scalar(select(func.count()).select_from(Verdict).where(*where)) or 0
    query = select(Verdict).where(*where).order_by(Verdict.measured_at.desc(), Verdict.id.desc())
    rows = session.scalars(query.limit(max(0, min(limit, EXPORT_LIMIT))))
    verdicts = [verdict_dict(row, job_id=shown_job_id(row, viewer_tenant)) for row in rows]
    return {"format": FILE_FORMAT, "verdicts": verdicts, "total": total}
