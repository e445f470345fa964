"""A job's records, below HTTP: the options a job is created with, and what a job is.

``OptimizeOptions`` is what a client may ask of a job (the upload service validates the
``config`` form field against it); ``JobPublic`` is a job as anyone outside the database
sees it, with its summary, its problem and its links (the events stream sends it, the API
answers with it). They are plain pydantic records with no web framework, so the services
build them and the API's schemas (``app.api.schemas.jobs``) re-export them: their names
and fields are the published contract (docs/openapi.json).
"""

from __future__ import annotations

import zlib
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_serializer, field_validator

from autofusion.app.core.errors import PROBLEM_BASE, job_problem
from autofusion.app.core.models import Job, JobStatus
from autofusion.fusion_core.config import MeasureOptions, OptimizeConfig

__all__ = [
    "CheckSummary",
    "DataFilePublic",
    "JobLinks",
    "JobProblem",
    "JobPublic",
    "JobSummary",
    "NodesSummary",
    "OptimizeOptions",
    "SpeedPublic",
    "VerdictsSummary",
    "fused_data_names",
]


class OptimizeOptions(OptimizeConfig):
    """The ``config`` form field: an ``OptimizeConfig`` plus an optional named strategy."""

    strategy: str | None = Field(default=None, min_length=1, max_length=200)
    # Not an optimizer option: kept out of the job's config, like strategy.
    callback_url: str | None = Field(
        default=None,
        min_length=1,
        max_length=2000,
        description="Where the service POSTs the job's summary, signed (Standard "
        "Webhooks), when the job ends; its host must be one of the server's "
        "webhook_allowed_hosts. Absent: the tenant's default, if it set one",
    )

    @field_validator("measure_options")
    @classmethod
    def _the_worker_keeps_the_cache(cls, options: MeasureOptions) -> MeasureOptions:
        # A folder or file named by a client would be a path on the worker's disk.
        if options.cache_dir is not None:
            raise ValueError(
                "measure_options.cache_dir is chosen by each worker (its decisions "
                "describe that machine); leave it out"
            )
        if options.verdicts_file is not None:
            raise ValueError(
                "measure_options.verdicts_file is the worker's (it hands each job the "
                "verdicts of the service's store); leave it out"
            )
        return options


class JobProblem(BaseModel):
    """A job's failure as an RFC 9457 problem object (no status: no HTTP request failed)."""

    type: str = Field(description=f"{PROBLEM_BASE}<slug>: the job problem types")
    title: str = Field(description="The type's title, the same for every job of this type")
    detail: str = Field(description="What happened to this job, and what to do")


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
    model_data: dict[str, str] = Field(
        default_factory=dict,
        description="The fused model's external-data files, by the name its tensors give "
        "(save each beside the model under that name): present once the job has "
        "succeeded, when the model's weights went to a data file (it came with one, or it "
        "is over 2 GB); empty when the model is one file",
    )


class SpeedPublic(BaseModel):
    """The paired speed verdict (``fusion_core.report.Speed``): fused / original run time
    per interleaved iteration at ``level``, its median and 95% interval."""

    model_config = ConfigDict(extra="allow")

    level: str = Field(description="The onnxruntime optimization level measured")
    ratio: float = Field(description="Median of fused / original per iteration (below 1: faster)")
    speedup: float = Field(description="1 / ratio: above 1 is faster")
    low: float | None = Field(default=None, description="Lower end of the ratio's interval")
    high: float | None = Field(default=None, description="Upper end of the ratio's interval")
    confidence: float | None = Field(default=None, description="The interval's coverage")
    runs: int | None = Field(default=None, description="Paired runs (iterations)")
    verdict: Literal["faster", "no measurable change", "slower"] | None = Field(
        default=None,
        description="faster: the whole interval below 1 and the median at least 1% below; "
        "slower: all of it above 1 and the median at least 1% above; no measurable change "
        "otherwise",
    )
    threads: int | None = Field(default=None, description="onnxruntime intra-op threads")


class CheckSummary(BaseModel):
    model_config = ConfigDict(extra="allow")

    passed: bool | None = None
    max_abs_diff: float | None = None
    error: str | None = None
    failure: str | None = Field(
        default=None,
        description="Why it did not pass: original_cannot_run, fused_cannot_run, "
        "cannot_load, invalid_graph or mismatch",
    )
    reason: str | None = Field(
        default=None, description="Why it did not pass, in one sentence in its kind's words"
    )
    left_out: list[str] = Field(
        default_factory=list,
        description="Sizes the check added and left out because the original cannot run "
        "there (a model that takes some lengths only): what a passed check did not check",
    )


class FallbackSummary(BaseModel):
    model_config = ConfigDict(extra="allow")

    reason: str = Field(description="Why the check of all the fusions failed")
    dropped: int = Field(description="Fusions taken out so that the rest passes")
    unchanged: bool = Field(description="No set of fusions passed: the model as it came")


class NodesSummary(BaseModel):
    model_config = ConfigDict(extra="allow")

    before: int | None = None
    after: int | None = None


class VerdictsSummary(BaseModel):
    """Measured selection and the verdict store (docs/service.md, "Verdicts")."""

    model_config = ConfigDict(extra="allow")

    reused: int = Field(description="Groups decided from the store's verdicts, not timed")
    measured: int = Field(description="Groups timed on the worker")
    stored: int = Field(description="Verdicts of this job the store took")


class JobSummary(BaseModel):
    """What the worker recorded about the result (``worker/plan.py`` ``summarize``, from
    ``fusion_core.report.read_report``). A key a server version did not write is absent."""

    model_config = ConfigDict(extra="allow")

    target: str | None = None
    registry_version: int | None = None
    strategy: dict[str, Any] | None = Field(
        default=None, description="The named strategy merged in: name, version"
    )
    counts: dict[str, int] | None = Field(default=None, description="Fusions per pattern")
    fusions: int | None = Field(default=None, description="Fusions applied, in all")
    check: CheckSummary | None = Field(
        default=None, description="The numerical check; null when it was skipped"
    )
    nodes: NodesSummary | None = None
    timings: dict[str, float] | None = Field(
        default=None, description="Seconds per phase, and in the sandbox in all (sandbox)"
    )
    attempts: int | None = None
    speed: SpeedPublic | None = Field(
        default=None, description="The measured speed; null when the job was not profiled"
    )
    skipped_patterns: list[str] | None = None
    fallback: FallbackSummary | None = Field(
        default=None,
        description="The check failed and the job fell back to the largest set of fusions "
        "that passes (the report's 'fallback' lists them); absent when it did not",
    )
    rejected: int | None = Field(
        default=None,
        description="Steps taken back as bugs of autofusion (the report's 'rejected')",
    )
    artifacts: dict[str, str] | None = Field(
        default=None, description="The report's renderings stored: name -> digest"
    )
    fused_data_files: list[DataFilePublic] | None = None
    measured: dict[str, dict[str, int]] | None = Field(
        default=None,
        description="Measured selection's groups per pattern: kept, dropped, and how they "
        "measured (faster, level, slower); absent when it did not run",
    )
    verdicts: VerdictsSummary | None = Field(
        default=None,
        description="Measured selection's use of the verdict store; absent when it did not run",
    )
    profile_error: str | None = Field(
        default=None,
        description="Why the job has no profile although it asked for one (profiling did "
        "not finish within the time limit): the fused model passed its check and is kept, "
        "its speed is unknown",
    )


def fused_data_names(job: Job) -> list[str]:
    """The fused model's data files by name, as its external-data entries name them, once
    the job has succeeded with one: its weights went to a data file (the model came with
    one, or it is over 2 GB); a client saves each beside the model under this name."""
    if job.status != JobStatus.succeeded or not job.fused_digest:
        return []
    return [entry["name"] for entry in (job.summary or {}).get("fused_data_files") or []]


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
    summary: JobSummary | None = None
    error: JobProblem | None = Field(
        default=None,
        description="Why the job failed, or why its last attempt did while it is tried "
        "again: a problem object (RFC 9457) whose type is one of the job problem types "
        "(docs/service.md); null when nothing failed",
    )
    error_type: str | None = Field(
        default=None,
        deprecated=True,
        description="error.type, for clients written before error was a problem object",
    )
    links: JobLinks
    waiting: str | None = Field(
        default=None,
        description="While the job is queued, why it waits: no worker is alive, its "
        "tenant is at its running limit, or the jobs ahead of it; null otherwise (and in "
        "lists and events, which do not compute it)",
    )

    @field_serializer("summary")
    def _summary_as_stored(self, summary: JobSummary | None):
        # Only what the worker wrote: no nulls for keys a server version did not write.
        return None if summary is None else summary.model_dump(mode="json", exclude_unset=True)

    @field_validator("created_at", "updated_at", "started_at", "finished_at")
    @classmethod
    def _utc(cls, value: datetime | None) -> datetime | None:
        return _as_utc(value)

    @classmethod
    def from_job(cls, job: Job, *, waiting: str | None = None) -> JobPublic:
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
            model_data={name: f"{base}/model/data/{name}" for name in fused_data_names(job)},
        )
        skip = ("links", "error", "error_type", "waiting")
        fields = {name: getattr(job, name) for name in cls.model_fields if name not in skip}
        if job.error:
            fields["error"] = job_problem(job.error_type, job.error)
            fields["error_type"] = fields["error"]["type"]
        return cls.model_validate({**fields, "links": links, "waiting": waiting})

    @property
    def etag(self) -> str:
        if self.waiting is None:
            return f'"{self.revision}"'
        # The reason changes while the row does not (a worker died, the queue moved): a
        # poll must not be told 304 then.
        return f'"{self.revision}-{zlib.crc32(self.waiting.encode()):08x}"'
