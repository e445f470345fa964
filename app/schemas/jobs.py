"""Schemas of the job resource: what ``POST /v1/optimize`` accepts and what jobs look like."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from app.models import Job, JobStatus
from fusion_core.config import OptimizeConfig

__all__ = [
    "DataFilePublic",
    "JobLinks",
    "JobPublic",
    "JobsPublic",
    "OptimizeOptions",
]


class OptimizeOptions(OptimizeConfig):
    """The ``config`` form field: an ``OptimizeConfig`` plus an optional named strategy."""

    strategy: str | None = Field(default=None, min_length=1, max_length=200)


class DataFilePublic(BaseModel):
    name: str
    digest: str


class JobLinks(BaseModel):
    self: str
    events: str
    cancel: str
    # Present once the job has succeeded (model) or finished with a report.
    model: str | None = None
    report: str | None = None
    # The report's renderings the worker stored: report.html, report.md.
    artifacts: dict[str, str] = Field(default_factory=dict)


def _as_utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every timestamp we store is UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class JobPublic(BaseModel):
    """One optimization job. ``revision`` changes whenever anything else does (the ETag)."""

    model_config = ConfigDict(from_attributes=True)

    id: str
    status: JobStatus
    stage: str
    progress: float = Field(ge=0, le=1)
    revision: int
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    attempts: int
    max_attempts: int
    cancel_requested: bool
    registry_version: int | None = None
    strategy: str | None = None
    config: dict[str, Any]
    model_name: str
    model_digest: str
    data_files: list[DataFilePublic]
    summary: dict[str, Any] | None = None
    error: str | None = None
    links: JobLinks

    @field_validator("created_at", "updated_at", "started_at", "finished_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return _as_utc(value)

    @classmethod
    def from_job(cls, job: Job) -> JobPublic:
        base = f"/v1/jobs/{job.id}"
        status = JobStatus(job.status)
        links = JobLinks(
            self=base,
            events=f"{base}/events",
            cancel=f"{base}/cancel",
            model=f"{base}/model" if status == JobStatus.succeeded and job.fused_digest else None,
            report=f"{base}/report" if status.is_final and job.report_digest else None,
            artifacts={
                name: f"{base}/artifacts/{name}"
                for name in ((job.summary or {}).get("artifacts") or {})
            },
        )
        fields = {name: getattr(job, name) for name in cls.model_fields if name != "links"}
        return cls.model_validate({**fields, "links": links})

    @property
    def etag(self) -> str:
        return f'"{self.revision}"'


class JobsPublic(BaseModel):
    """A page of jobs, newest first."""

    items: list[JobPublic]
    total: int
    limit: int
    offset: int
