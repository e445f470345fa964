"""Schemas of the pattern registry and the named strategies, named by role."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, RootModel

from autofusion.app.core.models import PatternRecord, PatternVersion, Strategy, StrategyVersion
from autofusion.app.services.pattern_trial import LISTED, PatternTrial
from autofusion.app.services.strategies import StrategySpec
from autofusion.fusion_core.targets import TARGET_NAMES

__all__ = [
    "PatternCreate",
    "PatternNearMiss",
    "PatternPublic",
    "PatternSummary",
    "PatternTestMatch",
    "PatternTestResult",
    "PatternVersionPublic",
    "PatternVersionsPublic",
    "PatternsPublic",
    "StrategiesPublic",
    "StrategyCreate",
    "StrategyPublic",
    "StrategyVersionPublic",
    "StrategyVersionsPublic",
]


def _as_utc(value: datetime) -> datetime:
    # SQLite hands back naive datetimes; every time the service stores is UTC.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]

_EXAMPLE_PATTERN = {
    "name": "acme.conv_relu",
    "description": "A Relu after a Conv, as one fused op.",
    "priority": 10,
    "targets": ["generic", "onnxruntime"],
    "nodes": [
        {"id": "conv", "op": "Conv"},
        {"id": "act", "op": "Relu", "inputs": {"0": "conv"}},
    ],
    "constraints": [{"kind": "attr", "node": "conv", "name": "group", "eq": 1}],
    "rewriter": {"name": "fused_region", "params": {"domain": "ai.acme"}},
}


class PatternCreate(RootModel[dict[str, Any]]):
    """A pattern specification (docs/patterns.md). It is validated by compiling it, so
    an error names the field: ``nodes.0.op``, ``rewriter.name``, ``constraints.1``."""

    model_config = ConfigDict(json_schema_extra={"examples": [_EXAMPLE_PATTERN]})


class PatternSummary(BaseModel):
    """One row of the pattern list."""

    name: str
    version: int
    enabled: bool
    builtin: bool
    description: str
    targets: list[str]
    priority: int
    rewriter: str

    @classmethod
    def from_record(cls, record: PatternRecord) -> PatternSummary:
        # Read the stored spec as data (it validated when it was written), so a listing
        # never fails on a spec that a newer fusion_core would reject.
        spec = record.spec
        return cls(
            name=record.name,
            version=record.version,
            enabled=record.enabled,
            builtin=record.builtin,
            description=str(spec.get("description", "")).strip(),
            targets=list(spec.get("targets") or TARGET_NAMES),
            priority=int(spec.get("priority", 0)),
            rewriter=str((spec.get("rewriter") or {}).get("name", "")),
        )


class PatternsPublic(BaseModel):
    registry_version: int
    count: int
    data: list[PatternSummary]

    @classmethod
    def from_records(cls, records: list[PatternRecord], registry_version: int) -> PatternsPublic:
        data = [PatternSummary.from_record(record) for record in records]
        return cls(registry_version=registry_version, count=len(data), data=data)


class PatternPublic(BaseModel):
    """A pattern's current state; its ETag is ``"<name>@<version>"``."""

    name: str
    version: int
    enabled: bool
    builtin: bool
    updated_at: UtcDatetime
    spec: dict[str, Any]

    @classmethod
    def from_record(cls, record: PatternRecord) -> PatternPublic:
        return cls(
            name=record.name,
            version=record.version,
            enabled=record.enabled,
            builtin=record.builtin,
            updated_at=record.updated_at,
            spec=record.spec,
        )


class PatternVersionPublic(BaseModel):
    """One immutable version of a pattern and the registry version its change made."""

    model_config = ConfigDict(from_attributes=True)

    name: str
    version: int
    registry_version: int
    change: str
    enabled: bool
    deleted: bool
    spec: dict[str, Any]
    created_at: UtcDatetime
    created_by: str | None


class PatternVersionsPublic(BaseModel):
    name: str
    count: int
    data: list[PatternVersionPublic]

    @classmethod
    def from_rows(cls, name: str, rows: list[PatternVersion]) -> PatternVersionsPublic:
        data = [PatternVersionPublic.model_validate(row) for row in rows]
        return cls(name=name, count=len(data), data=data)


class PatternTestMatch(BaseModel):
    nodes: list[str]


class PatternNearMiss(BaseModel):
    nodes: list[str]
    reason: str


class PatternTestResult(BaseModel):
    """What one pattern finds in a model after the pre-passes (no job is created).

    ``matches`` and ``near_misses`` list at most the first 1000 (``LISTED``) of each; the counts are
    complete.
    """

    pattern: str
    version: int
    enabled: bool
    model_nodes: int
    prepasses: list[str]
    match_count: int
    matches: list[PatternTestMatch]
    near_miss_count: int
    near_misses: list[PatternNearMiss]

    @classmethod
    def from_trial(cls, trial: PatternTrial) -> PatternTestResult:
        return cls(
            pattern=trial.pattern,
            version=trial.version,
            enabled=trial.enabled,
            model_nodes=trial.model_nodes,
            prepasses=trial.prepasses,
            match_count=len(trial.matches),
            matches=[PatternTestMatch(nodes=m) for m in trial.matches[:LISTED]],
            near_miss_count=len(trial.near_misses),
            near_misses=[
                PatternNearMiss(nodes=list(miss.nodes), reason=miss.reason)
                for miss in trial.near_misses[:LISTED]
            ],
        )


class StrategyCreate(StrategySpec):
    """A named strategy: ``patterns`` (null: all), minus ``exclude``, a default
    ``target`` and check options. Every pattern it names must exist in the registry."""

    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "name": "acme.mobile",
                    "description": "What our mobile models need.",
                    "patterns": ["conv_bn", "conv_activation", "dwconv_bn"],
                    "exclude": [],
                    "target": "onnxruntime",
                    "check": {"rtol": 1e-3, "atol": 1e-4, "samples": 2},
                }
            ]
        }
    )


class StrategyPublic(StrategySpec):
    """A strategy's current state; its ETag is ``"<name>@<version>"``."""

    version: int
    updated_at: UtcDatetime

    @classmethod
    def from_row(cls, strategy: Strategy) -> StrategyPublic:
        return cls(**strategy.data, version=strategy.version, updated_at=strategy.updated_at)


class StrategiesPublic(BaseModel):
    count: int
    data: list[StrategyPublic]

    @classmethod
    def from_rows(cls, rows: list[Strategy]) -> StrategiesPublic:
        return cls(count=len(rows), data=[StrategyPublic.from_row(row) for row in rows])


class StrategyVersionPublic(StrategySpec):
    """One immutable version of a strategy."""

    version: int
    created_at: UtcDatetime

    @classmethod
    def from_row(cls, row: StrategyVersion) -> StrategyVersionPublic:
        return cls(**row.data, version=row.version, created_at=row.created_at)


class StrategyVersionsPublic(BaseModel):
    name: str
    count: int
    data: list[StrategyVersionPublic]

    @classmethod
    def from_rows(cls, name: str, rows: list[StrategyVersion]) -> StrategyVersionsPublic:
        data = [StrategyVersionPublic.from_row(row) for row in rows]
        return cls(name=name, count=len(data), data=data)
