"""Schemas of the job resource: what ``POST /v1/optimize`` accepts and what jobs look like.

A job's own records live below HTTP (``app.core.job_records``, which the services build);
this module re-exports them and adds the resource's page, ``JobsPublic``.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from autofusion.app.core.job_records import (
    CheckSummary,
    DataFilePublic,
    JobLinks,
    JobProblem,
    JobPublic,
    JobSummary,
    NodesSummary,
    OptimizeOptions,
    SpeedPublic,
)

__all__ = [
    "CheckSummary",
    "DataFilePublic",
    "JobLinks",
    "JobProblem",
    "JobPublic",
    "JobSummary",
    "JobsPublic",
    "NodesSummary",
    "OptimizeOptions",
    "SpeedPublic",
]


class JobsPublic(BaseModel):
    """A page of jobs, newest first (AIP-158)."""

    items: list[JobPublic]
    total: int = Field(description="The jobs that match the filter, on all pages")
    page_size: int = Field(description="The page size used (after defaulting and clamping)")
    next_page_token: str | None = Field(
        default=None,
        description="Send as page_token for the next page, with the same status filter; "
        "null on the last page. Opaque: its content may change between server versions",
    )
