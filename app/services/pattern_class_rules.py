"""Patterns disabled on one machine class (``PatternClassRule``), on the evidence of the
verdict store (``app.services.pattern_class_stats``: how a pattern measured per class).

A pattern that runs slower on one class (an onnxruntime version, a CPU, a thread count)
can be disabled there and nowhere else: a rule names the pattern and the class's
``machine_key``, who made it and why, and the evidence it was made on (the combined
verdict and the verdict rows' ids). The worker adds the patterns disabled on its class
to every job's ``exclude`` (``worker/plan.py``, ``excluded_for``), measured or not. A
rule is made by a person (the dashboard, ``POST /v1/patterns/{name}/rules``) or, with
``verdicts_auto_disable`` on, by ``apply_auto_disable`` after a job's verdicts are
stored, from the verdicts still fresh (``verdict_max_age_days``, as their reuse); deleting
it enables the pattern again. An automatic rule lapses once the verdicts it was made on
are that old (``lapse_auto_rules``, by the retention sweep): while it stands nothing
measures the pattern on its class, so no newer evidence could ever lift it. A person's
rule stays until a person deletes it. Services flush; the caller commits.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import PatternClassRule, PatternRecord, as_utc, utcnow
from autofusion.app.services.pattern_class_stats import (
    MAX_ROWS,
    ClassStats,
    SignatureStats,
    class_label,
    evidence_url,
    pattern_stats,
)
from autofusion.app.services.registry import get_pattern
from autofusion.fusion_core.profiling.stats import SLOWER, PairedRatio

__all__ = [
    "AUTO",
    "MAX_ROWS",
    "ClassStats",
    "SignatureStats",
    "apply_auto_disable",
    "class_label",
    "describe_rule",
    "disable_on_class",
    "enable_on_class",
    "evidence_url",
    "excluded_for",
    "lapse_auto_rules",
    "lapses_at",
    "pattern_stats",
    "rule_counts",
    "rules",
]

logger = logging.getLogger(__name__)

AUTO = "auto"  # created_by of the rules verdicts_auto_disable makes


def rules(session: Session, pattern: str | None = None) -> list[PatternClassRule]:
    """The patterns disabled per class (or ``pattern``'s), by pattern, oldest first."""
    query = select(PatternClassRule).order_by(
        PatternClassRule.pattern, PatternClassRule.created_at, PatternClassRule.id
    )
    if pattern is not None:
        query = query.where(PatternClassRule.pattern == pattern)
    return list(session.scalars(query))


def rule_counts(session: Session) -> dict[str, int]:
    """Per pattern, on how many machine classes it is disabled (the patterns list)."""
    counts: dict[str, int] = defaultdict(int)
    for name in session.scalars(select(PatternClassRule.pattern)):
        counts[name] += 1
    return dict(counts)


def disable_on_class(
    session: Session,
    pattern: str,
    machine_key: str,
    *,
    by: str,
    reason: str,
    only_tenant: str | None = None,
) -> PatternClassRule:
    """Disable ``pattern`` on one machine class, on the evidence of its verdicts there
    (``only_tenant``: of that tenant's verdicts, the ones it may see).

    404 for a pattern the registry does not have; 422 without a verdict of it on that
    class (a rule is made on evidence); 409 when the rule exists (a concurrent one
    included: the insert does nothing on the unique key)."""
    get_pattern(session, pattern)
    stats = pattern_stats(session, pattern, machine_key=machine_key, only_tenant=only_tenant)
    if not stats:
        raise ProblemError(
            422,
            "no-verdicts",
            "No verdicts on this machine class",
            f"pattern {pattern!r} has no verdict on machine class {machine_key}: a pattern "
            "is disabled on a class on the evidence of its measurements there; "
            f"GET /v1/patterns/{pattern}/verdicts lists the classes it was measured on",
            field="machine_key",
        )
    if stats[0].rule is not None or not _insert_rule(session, stats[0], by=by, reason=reason):
        raise _rule_exists(pattern, machine_key)
    logger.info(
        "pattern %s disabled on machine class %s (%s) by %s: %s",
        pattern,
        machine_key,
        stats[0].label,
        by,
        reason,
    )
    return _rule(session, pattern, machine_key)


def _rule_exists(pattern: str, machine_key: str) -> ProblemError:
    return ProblemError(
        409,
        "pattern-rule-exists",
        "Pattern already disabled on this machine class",
        f"pattern {pattern!r} is already disabled on machine class {machine_key}; "
        f"DELETE /v1/patterns/{pattern}/rules/{machine_key} enables it again",
    )


def _insert_rule(session: Session, stats: ClassStats, *, by: str, reason: str) -> bool:
    """INSERT ... ON CONFLICT DO NOTHING: False when a rule of the class was there."""
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = (
        dialect.insert(PatternClassRule)
        .values(
            pattern=stats.pattern,
            machine_key=stats.machine_key,
            machine=stats.machine,
            reason=reason,
            evidence=stats.evidence(),
            created_by=by,
            created_at=utcnow(),
        )
        .on_conflict_do_nothing(index_elements=["pattern", "machine_key"])
        .returning(PatternClassRule.id)  # no row when it did nothing (rowcount may be -1)
    )
    return session.execute(statement).first() is not None


def _rule(session: Session, pattern: str, machine_key: str) -> PatternClassRule:
    query = select(PatternClassRule).where(
        PatternClassRule.pattern == pattern, PatternClassRule.machine_key == machine_key
    )
    return session.scalars(query.execution_options(populate_existing=True)).one()


def enable_on_class(session: Session, pattern: str, machine_key: str) -> None:
    """Enable ``pattern`` on the class again (the rule is deleted); 404 without one."""
    result = session.execute(
        delete(PatternClassRule).where(
            PatternClassRule.pattern == pattern, PatternClassRule.machine_key == machine_key
        )
    )
    if result.rowcount == 0:
        raise ProblemError(
            404,
            "pattern-rule-not-found",
            "Pattern not disabled on this machine class",
            f"pattern {pattern!r} is not disabled on machine class {machine_key}; "
            "GET /v1/pattern-rules lists the patterns disabled per class",
        )
    logger.info("pattern %s enabled again on machine class %s", pattern, machine_key)


def excluded_for(session: Session, machine_key: str) -> dict[str, str]:
    """The patterns disabled on this machine class, each with why: who, when, the reason
    and the evidence (what a job's summary says)."""
    query = select(PatternClassRule).where(PatternClassRule.machine_key == machine_key)
    return {rule.pattern: describe_rule(rule) for rule in session.scalars(query)}


def describe_rule(rule: PatternClassRule) -> str:
    """e.g. ``disabled on this machine class by key:3 on 2026-12-06 12:00 UTC: slower
    here; evidence: ratio 1.120 (95% interval ...), 4 measurements in 3 jobs (URL)``."""
    when = as_utc(rule.created_at).strftime("%Y-%m-%d %H:%M UTC")
    evidence = rule.evidence if isinstance(rule.evidence, Mapping) else {}
    combined = evidence.get("combined") if isinstance(evidence.get("combined"), Mapping) else {}
    ratio = combined.get("ratio") if isinstance(combined.get("ratio"), Mapping) else None
    measured = ""
    if ratio is not None:
        try:
            measured = f"ratio {PairedRatio(**ratio).describe()}, "
        except TypeError:  # a rule written by another version: leave the ratio out
            measured = ""
    count, jobs = evidence.get("measurements", 0), evidence.get("jobs", 0)
    return (
        f"disabled on this machine class by {rule.created_by} on {when}: {rule.reason}; "
        f"evidence: {measured}{count} measurement{'' if count == 1 else 's'} in {jobs} "
        f"job{'' if jobs == 1 else 's'} ({evidence_url(rule.pattern, rule.machine_key)})"
    )


def apply_auto_disable(
    session: Session, settings: Settings, patterns: Iterable[str], *, now: datetime | None = None
) -> list[str]:
    """With ``verdicts_auto_disable`` on, disable each of ``patterns`` (the patterns of
    the verdicts a job just stored) on every machine class where its fresh measurements
    (at most ``verdict_max_age_days`` old at ``now``), combined, are slower with
    confidence, from at least ``verdicts_auto_disable_min_jobs`` distinct jobs. Returns
    the patterns disabled
    (each once); rules that exist stay as they are. A rule a person deleted is made
    again by the next job whose verdicts still add up to this (the evidence is all the
    class's measurements of the pattern's version): to keep a pattern on against
    it, turn the setting off."""
    if not settings.verdicts_auto_disable:
        return []
    since = (now or utcnow()) - timedelta(days=settings.verdict_max_age_days)
    disabled: list[str] = []
    for name in sorted(set(patterns)):
        if not _in_registry(session, name):  # a job's own extra pattern: not ours to rule
            continue
        for stats in pattern_stats(session, name, since=since):
            if stats.rule is None and _slower_enough(stats, settings):
                reason = (
                    f"measured slower with confidence in {stats.jobs} jobs "
                    "(automatic: verdicts_auto_disable)"
                )
                if _insert_rule(session, stats, by=AUTO, reason=reason):
                    logger.warning(
                        "pattern %s disabled automatically on machine class %s (%s): "
                        "combined ratio %s over %d jobs",
                        name,
                        stats.machine_key,
                        stats.label,
                        stats.combined.ratio.describe(),
                        stats.jobs,
                    )
                    disabled.append(name)
    return list(dict.fromkeys(disabled))


def lapses_at(rule: PatternClassRule, settings: Settings) -> datetime | None:
    """When the retention sweep lets an automatic rule lapse (``lapse_auto_rules``);
    None for a person's rule, which never does."""
    if rule.created_by != AUTO:
        return None
    return as_utc(rule.created_at) + timedelta(days=settings.verdict_max_age_days)


def lapse_auto_rules(
    session: Session, settings: Settings, *, now: datetime | None = None
) -> list[tuple[str, str]]:
    """Delete the automatic rules made more than ``verdict_max_age_days`` before ``now``
    (every verdict they were made on is older: none is reused any more); (pattern,
    machine key) of each. The pattern is measured on that class again, and fresh
    verdicts that add up to slower make the rule again."""
    cutoff = (now or utcnow()) - timedelta(days=settings.verdict_max_age_days)
    query = select(PatternClassRule).where(
        PatternClassRule.created_by == AUTO, PatternClassRule.created_at < cutoff
    )
    lapsed = [(rule.pattern, rule.machine_key) for rule in session.scalars(query)]
    for pattern, key in lapsed:
        session.execute(
            delete(PatternClassRule).where(
                PatternClassRule.pattern == pattern,
                PatternClassRule.machine_key == key,
                PatternClassRule.created_by == AUTO,
                PatternClassRule.created_at < cutoff,  # one a person remade meanwhile stays
            )
        )
        logger.warning(
            "pattern %s enabled again on machine class %s: its automatic rule lapsed "
            "(the verdicts it was made on are older than %g days and no longer reused)",
            pattern,
            key,
            settings.verdict_max_age_days,
        )
    return lapsed


def _in_registry(session: Session, name: str) -> bool:
    record = session.get(PatternRecord, name)
    return record is not None and not record.deleted


def _slower_enough(stats: ClassStats, settings: Settings) -> bool:
    combined = stats.combined
    return (
        combined.ratio.verdict == SLOWER
        and combined.confident
        and stats.jobs >= settings.verdicts_auto_disable_min_jobs
    )
