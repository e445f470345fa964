"""How often each pattern fired, and how it measured, in a tenant's recent jobs.

Read from the jobs' stored summaries (``Job.summary``: ``counts``, fusions per pattern,
and ``measured``, measured selection's groups per pattern; ``worker/plan.py``
``summarize``), never from the reports in the artifact store: one query, bounded to the
tenant's ``window`` newest finished jobs, so the patterns page costs the same however
many jobs a tenant has run. A tenant sees its own jobs' usage only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from autofusion.app.core.models import Job, JobStatus

__all__ = ["DEFAULT_WINDOW", "PatternUsage", "UsageWindow", "pattern_usage", "sum_usage"]

# The newest finished jobs read: enough to say which patterns a team's models use, few
# enough that the page answers at once (the summaries are a few kB each).
DEFAULT_WINDOW = 200
_FINISHED = (JobStatus.succeeded.value, JobStatus.failed.value)
_MEASURED_KEYS = ("kept", "dropped", "faster", "level", "slower")


@dataclass
class PatternUsage:
    """One pattern in the window: fusions applied, jobs it fired in, and measured
    selection's groups of its fusions by decision and by verdict."""

    fusions: int = 0
    jobs: int = 0
    measured: dict[str, int] = field(default_factory=lambda: dict.fromkeys(_MEASURED_KEYS, 0))

    @property
    def was_measured(self) -> bool:
        return self.measured["kept"] + self.measured["dropped"] > 0


@dataclass(frozen=True)
class UsageWindow:
    """What was read: ``jobs`` finished jobs, at most ``limit`` (the newest)."""

    jobs: int
    limit: int
    by_pattern: dict[str, PatternUsage]

    def of(self, name: str) -> PatternUsage:
        return self.by_pattern.get(name) or PatternUsage()


def pattern_usage(session: Session, tenant_id: str, *, window: int = DEFAULT_WINDOW) -> UsageWindow:
    """Usage per pattern over the tenant's ``window`` newest finished jobs (one query)."""
    rows = session.scalars(
        select(Job.summary)
        .where(Job.tenant_id == tenant_id, Job.status.in_(_FINISHED))
        .order_by(Job.created_at.desc(), Job.id.desc())
        .limit(window)
    ).all()
    return UsageWindow(jobs=len(rows), limit=window, by_pattern=sum_usage(rows))


def sum_usage(summaries: Iterable[Mapping[str, Any] | None]) -> dict[str, PatternUsage]:
    """Add up the summaries; a key an older worker did not write counts as nothing."""
    usage: dict[str, PatternUsage] = {}
    for summary in summaries:
        if not isinstance(summary, Mapping):
            continue  # a failed job that never got a result
        for name, count in _mapping(summary.get("counts")).items():
            if isinstance(count, int) and count > 0:
                entry = usage.setdefault(name, PatternUsage())
                entry.fusions += count
                entry.jobs += 1
        for name, groups in _mapping(summary.get("measured")).items():
            entry = usage.setdefault(name, PatternUsage())
            for key in _MEASURED_KEYS:
                value = _mapping(groups).get(key)
                entry.measured[key] += value if isinstance(value, int) else 0
    return usage


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
