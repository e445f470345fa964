"""Schemas of the verdict store: a verdict as the API lists it, a page of them, the
verdicts file (export and import) and what an import did."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from autofusion.app.services.verdicts import FILE_FORMAT

__all__ = ["VerdictPublic", "VerdictRatio", "VerdictsFile", "VerdictsImported", "VerdictsPublic"]

VerdictWord = Literal["faster", "no measurable change", "slower"]


class VerdictRatio(BaseModel):
    """The model with the group / without it, per paired run (below 1: the group is
    faster), its median and interval."""

    median: float
    low: float
    high: float
    confidence: float = Field(description="The interval's coverage")
    runs: int = Field(description="Paired runs")
    verdict: VerdictWord


class VerdictPublic(BaseModel):
    """One measured decision on a group of fusions: the file form of a verdict
    (`autofusion verdicts export`) with its id."""

    id: int
    signature: str = Field(
        description="sha256 of the region signature: the pattern, its version's hash, the "
        "fused ops and the regions' op types, attributes, shape classes and dtypes"
    )
    pattern: str
    pattern_hash: str = Field(description="sha256 of the pattern's spec: a new version is new")
    group: str = Field(description="The group of fusions, for people")
    region: dict[str, Any] = Field(
        description="What was fused: op types, the number of fusions, one short text per "
        "distinct region; never a node or tensor name, never a weight"
    )
    machine_key: str = Field(description="sha256 of the machine class")
    machine: dict[str, Any] = Field(
        description="The machine class: CPU model and instruction set, CPUs, architecture, "
        "onnxruntime's version, providers, level and threads"
    )
    target: str
    ratio: VerdictRatio
    measured_at: str = Field(description="When it was measured (ISO 8601, UTC)")
    with_ms: float | None = Field(
        default=None, description="The median run time of the model with the group, in ms"
    )
    predicted: dict[str, Any] | None = Field(
        default=None, description="The cost model's prediction: saved_us, before_us, ..."
    )
    job_id: str | None = Field(
        default=None,
        description="The job that measured it, when that job is the caller's tenant's; "
        "null for another tenant's job (verdicts are shared, jobs are not) and for imports",
    )
    job_visible: bool = Field(description="job_id names a job the caller may read")
    source: Literal["measured", "imported"]


class VerdictsPublic(BaseModel):
    """A page of verdicts, newest measurement first (AIP-158)."""

    items: list[VerdictPublic]
    total: int = Field(description="The verdicts that match the filters, on all pages")
    page_size: int = Field(description="The page size used (after defaulting and clamping)")
    next_page_token: str | None = Field(
        default=None,
        description="Send as page_token for the next page, with the same filters; null on "
        "the last page. Opaque: its content may change between server versions",
    )


class VerdictsFile(BaseModel):
    """A verdicts file, as `GET /v1/verdicts/export` writes it and
    `POST /v1/verdicts/import` reads it (the records are validated one by one)."""

    model_config = ConfigDict(extra="allow")

    format: str = Field(description=f'"{FILE_FORMAT}"')
    verdicts: list[Any] = Field(description="Verdicts: VerdictPublic's fields without id")
    total: int | None = Field(
        default=None,
        description="Export: the verdicts that matched the filters (the file holds the "
        "newest of them, at most limit)",
    )


class VerdictsImported(BaseModel):
    """What an import stored."""

    imported: int = Field(description="Verdicts stored")
    duplicates: int = Field(
        description="Verdicts already stored (the same signature, machine class, time, "
        "median and runs): not stored twice"
    )
    skipped: list[str] = Field(description="Invalid verdicts left out, each with why")
