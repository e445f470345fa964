"""Schemas of what the registry learned from the verdict store: a pattern's measurements
per machine class, and the patterns disabled per class (``app.services.pattern_class_rules``).

Verdicts are shared across tenants; the jobs they came from are not. A combined verdict
says how many jobs it rests on, and lists only the asking tenant's own (``your_jobs``).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from autofusion.app.core.config import Settings
from autofusion.app.core.models import PatternClassRule
from autofusion.app.services.pattern_class_rules import (
    ClassStats,
    class_label,
    evidence_url,
    lapses_at,
)

__all__ = [
    "MACHINE_KEY_PATTERN",
    "PatternClassCombinedPublic",
    "PatternClassRatioPublic",
    "PatternClassRuleCreate",
    "PatternClassRuleEvidence",
    "PatternClassRulePublic",
    "PatternClassRulesPublic",
    "PatternClassSignaturePublic",
    "PatternClassVerdictsPublic",
    "PatternVerdictsPublic",
]

MACHINE_KEY_PATTERN = r"^[0-9a-f]{64}$"


class PatternClassRatioPublic(BaseModel):
    """With the pattern's fusions / without them (below 1: faster), and its interval."""

    median: float
    low: float
    high: float
    confidence: float
    runs: int
    verdict: str = Field(description="faster, no measurable change, or slower")


class PatternClassCombinedPublic(BaseModel):
    """Measurements combined (inverse-variance on the log ratio, their spread counted)."""

    ratio: PatternClassRatioPublic
    measurements: int
    agree: bool = Field(description="every measurement has the same verdict")
    confident: bool = Field(description="a decision may be taken from it without timing")
    jobs: int = Field(description="distinct jobs the measurements came from")

    @classmethod
    def of(cls, combined: Any) -> PatternClassCombinedPublic:
        """From a ``CombinedVerdict`` or its ``to_dict()`` (as a rule's evidence keeps it)."""
        data = dict(combined) if isinstance(combined, Mapping) else combined.to_dict()
        jobs = data.get("jobs")
        return cls.model_validate({**data, "jobs": len(jobs) if isinstance(jobs, list) else 0})


class PatternClassSignaturePublic(BaseModel):
    """One region signature of the pattern on the class."""

    signature: str
    group: str
    measurements: int
    combined: PatternClassCombinedPublic


class PatternClassRuleEvidence(BaseModel):
    """What the rule was decided on."""

    combined: PatternClassCombinedPublic | None = None
    measurements: int = 0
    jobs: int = 0
    verdict_ids: list[int] = Field(default_factory=list, description="the first 500")


class PatternClassRulePublic(BaseModel):
    """A pattern disabled on one machine class: jobs on that class leave it out."""

    pattern: str
    machine_key: str
    label: str = Field(description="the class in a few words: CPU, threads, level, onnxruntime")
    machine: dict[str, Any]
    reason: str
    created_by: str = Field(description='the API key that made it ("key:<id>"), or "auto"')
    created_at: datetime
    evidence: PatternClassRuleEvidence
    evidence_url: str = Field(description="the verdicts behind it: GET /v1/verdicts, filtered")
    lapses_at: datetime | None = Field(
        default=None,
        description="an automatic rule's end: created_at plus verdict_max_age_days, when the "
        "retention sweep deletes it (its evidence is no longer fresh); null for a person's",
    )

    @classmethod
    def from_rule(cls, rule: PatternClassRule, settings: Settings) -> PatternClassRulePublic:
        evidence = rule.evidence if isinstance(rule.evidence, Mapping) else {}
        combined = evidence.get("combined")
        return cls(
            pattern=rule.pattern,
            machine_key=rule.machine_key,
            label=class_label(rule.machine or {}),
            machine=dict(rule.machine or {}),
            reason=rule.reason,
            created_by=rule.created_by,
            created_at=_utc(rule.created_at),
            evidence=PatternClassRuleEvidence(
                combined=PatternClassCombinedPublic.of(combined) if combined else None,
                measurements=int(evidence.get("measurements") or 0),
                jobs=int(evidence.get("jobs") or 0),
                verdict_ids=list(evidence.get("verdict_ids") or []),
            ),
            evidence_url=evidence_url(rule.pattern, rule.machine_key),
            lapses_at=lapses_at(rule, settings),
        )


class PatternClassVerdictsPublic(BaseModel):
    """A pattern on one machine class: how its measurements came out there."""

    machine_key: str
    label: str
    machine: dict[str, Any]
    faster: int
    level: int = Field(description="no measurable change")
    slower: int
    measurements: int
    jobs: int
    your_jobs: list[str] = Field(description="this tenant's jobs among them (the newest 20)")
    older_versions: int = Field(
        description="measurements of older versions of the pattern, not counted here"
    )
    newest: datetime
    combined: PatternClassCombinedPublic
    signatures: list[PatternClassSignaturePublic]
    rule: PatternClassRulePublic | None = Field(
        description="the pattern is disabled on this class; null: it is not"
    )
    evidence_url: str

    @classmethod
    def from_stats(cls, stats: ClassStats, settings: Settings) -> PatternClassVerdictsPublic:
        return cls(
            machine_key=stats.machine_key,
            label=stats.label,
            machine=stats.machine,
            faster=stats.faster,
            level=stats.level,
            slower=stats.slower,
            measurements=stats.measurements,
            jobs=stats.jobs,
            your_jobs=list(stats.tenant_jobs),
            older_versions=stats.older_versions,
            newest=stats.newest,
            combined=PatternClassCombinedPublic.of(stats.combined),
            signatures=[
                PatternClassSignaturePublic(
                    signature=s.signature,
                    group=s.group,
                    measurements=s.measurements,
                    combined=PatternClassCombinedPublic.of(s.combined),
                )
                for s in stats.signatures
            ],
            rule=PatternClassRulePublic.from_rule(stats.rule, settings) if stats.rule else None,
            evidence_url=stats.evidence_url,
        )


class PatternVerdictsPublic(BaseModel):
    """A pattern's measurements per machine class (newest first), and its rules."""

    pattern: str
    classes: list[PatternClassVerdictsPublic]
    rules: list[PatternClassRulePublic]


class PatternClassRulesPublic(BaseModel):
    """The patterns disabled per machine class, by pattern."""

    rules: list[PatternClassRulePublic]


class PatternClassRuleCreate(BaseModel):
    """Disable the pattern on one machine class (one of those its verdicts name)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "machine_key": "3f" * 32,
                    "reason": "slower on this CPU with onnxruntime 1.20 (see the verdicts)",
                }
            ]
        },
    )

    machine_key: str = Field(pattern=MACHINE_KEY_PATTERN, description="the class's sha256")
    reason: Annotated[
        str, StringConstraints(strip_whitespace=True, min_length=1, max_length=2000)
    ] = Field(description="why, for the next person")


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value
