"""A pattern's measurements per machine class, read from the verdict store: how often it
was measured faster, level or slower there, and by how much, combined.

Measured selection stores one verdict per group of fusions it decided (the table
``verdicts``, written by ``app.services.verdicts``). Read per pattern and machine class
(its ``machine_key``), they are counted and combined (``combine_verdicts``:
inverse-variance on the log ratios, contradicting measurements widening the interval),
per region signature and for the class as a whole. Only the pattern version measured
last on a class counts (a new version of the spec is a new pattern to measure; older
measurements are counted apart, as ``older_versions``). ``app.services.pattern_class_rules``
disables a pattern on a class on this evidence.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from sqlalchemy import select
from sqlalchemy.orm import Session

from autofusion.app.core.models import PatternClassRule, Verdict, as_utc
from autofusion.fusion_core.profiling.stats import FASTER, SLOWER, PairedRatio
from autofusion.fusion_core.profiling.verdicts import (
    CombinedVerdict,
    VerdictRecord,
    combine_verdicts,
)

__all__ = [
    "MAX_EVIDENCE_IDS",
    "MAX_ROWS",
    "ClassStats",
    "SignatureStats",
    "class_label",
    "evidence_url",
    "pattern_stats",
]

# The newest verdicts read per call: a page costs the same however long the store has
# been filling (each pattern's newest measurements are the ones that matter).
MAX_ROWS = 20_000
MAX_EVIDENCE_IDS = 500  # verdict ids kept in a rule's evidence (and the count of all)
MAX_TENANT_JOBS = 20  # the viewer's own source jobs listed per class
_COUNTS = {FASTER: "faster", SLOWER: "slower"}  # anything else: "level"
_COLUMNS = (
    Verdict.id,
    Verdict.signature,
    Verdict.pattern,
    Verdict.pattern_hash,
    Verdict.group_key,
    Verdict.machine_key,
    Verdict.target,
    Verdict.median,
    Verdict.low,
    Verdict.high,
    Verdict.confidence,
    Verdict.runs,
    Verdict.verdict,
    Verdict.measured_at,
    Verdict.job_id,
    Verdict.tenant_id,
)


@dataclass(frozen=True)
class SignatureStats:
    """One region signature of the pattern on the class, its measurements combined."""

    signature: str
    group: str
    measurements: int
    combined: CombinedVerdict


@dataclass(frozen=True)
class ClassStats:
    """A pattern on one machine class: what its measurements say."""

    pattern: str
    machine_key: str
    machine: dict[str, Any]
    faster: int
    level: int
    slower: int
    jobs: int  # distinct jobs the measurements came from
    tenant_jobs: tuple[str, ...]  # of those, the asking tenant's (newest first, a few)
    signatures: tuple[SignatureStats, ...]
    combined: CombinedVerdict  # every measurement of the class, combined
    newest: datetime
    older_versions: int  # measurements of older versions of the pattern, not counted
    verdict_ids: tuple[int, ...]  # the rows counted, newest first
    rule: PatternClassRule | None

    @property
    def label(self) -> str:
        return class_label(self.machine)

    @property
    def measurements(self) -> int:
        return self.faster + self.level + self.slower

    @property
    def evidence_url(self) -> str:
        return evidence_url(self.pattern, self.machine_key)

    def evidence(self) -> dict[str, Any]:
        """What a rule made on these stats keeps: the combined verdict and the rows."""
        return {
            "combined": self.combined.to_dict(),
            "measurements": self.measurements,
            "jobs": self.jobs,
            "verdict_ids": list(self.verdict_ids[:MAX_EVIDENCE_IDS]),
        }


def class_label(machine: Mapping[str, Any]) -> str:
    """A machine class in a few words: CPU model, threads, level, onnxruntime."""
    threads = machine.get("threads")
    parts = [
        str(machine.get("cpu") or "unknown CPU"),
        f"{threads} thread{'' if threads == 1 else 's'}" if threads else None,
        str(machine.get("level") or "") or None,
        f"onnxruntime {machine['onnxruntime']}" if machine.get("onnxruntime") else None,
    ]
    return " · ".join(p for p in parts if p)


def evidence_url(pattern: str, machine_key: str) -> str:
    """The verdicts behind a class's stats (``GET /v1/verdicts``, filtered)."""
    return "/v1/verdicts?" + urlencode({"pattern": pattern, "machine_key": machine_key})


def pattern_stats(
    session: Session,
    pattern: str | None = None,
    *,
    machine_key: str | None = None,
    tenant_id: str | None = None,
    only_tenant: str | None = None,
    since: datetime | None = None,
) -> list[ClassStats]:
    """Per pattern (or only ``pattern``) and machine class, the newest ``MAX_ROWS``
    verdicts counted and combined; by pattern, then newest measurement first.
    ``tenant_id``: whose source jobs ``tenant_jobs`` lists; ``only_tenant``: count only
    that tenant's verdicts (where ``verdicts_shared`` is off, a tenant sees only those);
    ``since``: only verdicts measured then or later (the fresh ones)."""
    query = select(*_COLUMNS).order_by(Verdict.measured_at.desc(), Verdict.id.desc())
    if since is not None:
        query = query.where(Verdict.measured_at >= since)
    if only_tenant is not None:
        query = query.where(Verdict.tenant_id == only_tenant)
    if pattern is not None:
        query = query.where(Verdict.pattern == pattern)
    if machine_key is not None:
        query = query.where(Verdict.machine_key == machine_key)
    grouped: dict[tuple[str, str], list[Any]] = defaultdict(list)
    for row in session.execute(query.limit(MAX_ROWS)):
        grouped[(row.pattern, row.machine_key)].append(row)
    if not grouped:
        return []
    machines = _machines(session, [rows[0].id for rows in grouped.values()])
    found = _rules_by_class(session, pattern)
    stats = [
        _class_stats(rows, machines.get(rows[0].id) or {}, found.get(key), tenant_id)
        for key, rows in grouped.items()
    ]
    return sorted(stats, key=lambda s: (s.pattern, -s.newest.timestamp(), s.machine_key))


def _machines(session: Session, ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """The machine class of these rows (the newest of each class): one query."""
    query = select(Verdict.id, Verdict.machine).where(Verdict.id.in_(ids))
    return {row.id: dict(row.machine or {}) for row in session.execute(query)}


def _rules_by_class(session: Session, pattern: str | None) -> dict[tuple[str, str], Any]:
    query = select(PatternClassRule)
    if pattern is not None:
        query = query.where(PatternClassRule.pattern == pattern)
    return {(r.pattern, r.machine_key): r for r in session.scalars(query)}


def _class_stats(
    rows: list[Any], machine: dict[str, Any], rule: PatternClassRule | None, tenant: str | None
) -> ClassStats:
    """One class's rows (newest first): those of the version measured last."""
    current = [r for r in rows if r.pattern_hash == rows[0].pattern_hash]
    counts = dict.fromkeys(("faster", "level", "slower"), 0)
    by_signature: dict[str, list[Any]] = defaultdict(list)
    for row in current:
        counts[_COUNTS.get(row.verdict, "level")] += 1
        by_signature[row.signature].append(row)
    signatures = tuple(
        SignatureStats(
            signature,
            group[0].group_key,
            len(group),
            _combine(group),
        )
        for signature, group in by_signature.items()
    )
    jobs = list(dict.fromkeys(r.job_id for r in current if r.job_id))
    mine = [r.job_id for r in current if r.job_id and tenant and r.tenant_id == tenant]
    return ClassStats(
        pattern=rows[0].pattern,
        machine_key=rows[0].machine_key,
        machine=machine,
        **counts,
        jobs=len(jobs),
        tenant_jobs=tuple(dict.fromkeys(mine))[:MAX_TENANT_JOBS],
        signatures=signatures,
        combined=_combine(current),
        newest=as_utc(rows[0].measured_at),
        older_versions=len(rows) - len(current),
        verdict_ids=tuple(r.id for r in current),
        rule=rule,
    )


def _combine(rows: Iterable[Any]) -> CombinedVerdict:
    return combine_verdicts(_record(r) for r in rows)


def _record(row: Any) -> VerdictRecord:
    """A verdict row as the record ``combine_verdicts`` reads (its ratio and job; the
    region and machine, which combining does not read, are left empty)."""
    ratio = PairedRatio(
        median=row.median,
        low=row.low,
        high=row.high,
        confidence=row.confidence,
        runs=row.runs,
        verdict=row.verdict,
    )
    return VerdictRecord(
        signature=row.signature,
        pattern=row.pattern,
        pattern_hash=row.pattern_hash,
        group=row.group_key,
        region={},
        machine_key=row.machine_key,
        machine={},
        target=row.target,
        ratio=ratio,
        measured_at=as_utc(row.measured_at).isoformat(),
        job_id=row.job_id,
    )
