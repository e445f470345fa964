"""When each phase of a job's attempt began: ``Job.phases``.

``[{"stage": "fetching", "at": "2026-12-01T20:39:01.123+00:00"}, ...]``, in the order the
phases began. Claiming a job starts the list afresh with ``starting`` (one attempt's
phases, never two attempts' mixed); the worker appends an entry with each progress
report whose stage differs from the last one (``next_phases``). A phase ends where the
next begins, the last one at ``finished_at`` (``phase_spans``).

The dashboard reads them to say how long each phase took, and to estimate how long a
running job has left from the phases of the tenant's earlier jobs (``recent_phases``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autofusion.app.core.models import Job, JobStatus, as_utc

__all__ = [
    "MAX_PHASES",
    "PastJob",
    "Span",
    "first_phase",
    "next_phases",
    "phase_spans",
    "recent_phases",
]

MAX_PHASES = 64  # a job has about six; a stage that flaps stops being recorded there


@dataclass(frozen=True)
class Span:
    """One phase: its stage, when it began, and when it ended (None: still running)."""

    stage: str
    start: datetime
    end: datetime | None

    def seconds(self, now: datetime) -> float:
        return max(((self.end or now) - self.start).total_seconds(), 0.0)


@dataclass(frozen=True)
class PastJob:
    """A finished job's config and phases, for estimates."""

    config: dict[str, Any]
    spans: list[Span]


def first_phase(now: datetime) -> list[dict[str, str]]:
    """The phases of a job just claimed."""
    return [{"stage": "starting", "at": now.isoformat()}]


def next_phases(
    phases: Sequence[dict[str, str]], stage: str, now: datetime
) -> list[dict[str, str]] | None:
    """``phases`` with ``stage`` begun at ``now``; None when it is the current stage
    already (nothing to write)."""
    if phases and phases[-1].get("stage") == stage:
        return None
    if len(phases) >= MAX_PHASES:
        return None
    return [*phases, {"stage": stage, "at": now.isoformat()}]


def phase_spans(
    phases: Any, started_at: datetime | None, finished_at: datetime | None
) -> list[Span]:
    """The phases of the attempt that began at ``started_at`` as spans; entries that are
    malformed or older than the attempt (a retried job before its first report) are
    left out."""
    if not isinstance(phases, list) or started_at is None:
        return []
    since = as_utc(started_at)
    begun: list[tuple[str, datetime]] = []
    for entry in phases:
        try:
            stage, at = str(entry["stage"]), as_utc(datetime.fromisoformat(entry["at"]))
        except (KeyError, TypeError, ValueError):
            continue
        if at >= since and (not begun or at >= begun[-1][1]):
            begun.append((stage, at))
    if not begun:
        return []
    ends = [at for _, at in begun[1:]] + [as_utc(finished_at) if finished_at else None]
    return [Span(stage, at, end) for (stage, at), end in zip(begun, ends, strict=True)]


def recent_phases(session: Session, tenant_id: str, *, limit: int = 40) -> list[PastJob]:
    """The tenant's latest succeeded jobs that recorded their phases, newest first."""
    rows = session.execute(
        select(Job.config, Job.phases, Job.started_at, Job.finished_at)
        .where(Job.tenant_id == tenant_id, Job.status == JobStatus.succeeded.value)
        .order_by(Job.created_at.desc())
        .limit(limit)
    ).all()
    past = []
    for config, phases, started_at, finished_at in rows:
        spans = phase_spans(phases, started_at, finished_at)
        if spans and finished_at is not None:
            past.append(PastJob(config if isinstance(config, dict) else {}, spans))
    return past
