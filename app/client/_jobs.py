"""A job as the client sees it (``Job``, typed from the documented resource) and the one
loop that follows a job to its end (``poll``), which the CLI's ``submit --wait`` and
``jobs wait`` share with ``Client.wait``."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from autofusion.app.client._errors import WaitTimeout
from autofusion.app.client._http import Transport, read_json, retry_after

__all__ = ["FINAL", "Job", "poll"]

FINAL = ("succeeded", "failed", "cancelled")


@dataclass(frozen=True)
class Job:
    """A job resource (``GET /v1/jobs/{id}``). The fields scripts branch on are typed; the
    rest of what the server sent is in ``data``, as it sent it."""

    id: str
    status: str  # queued, running, succeeded, failed, cancelled
    url: str  # the job resource, absolute
    stage: str | None = None
    progress: float = 0.0
    # A failed job's problem object (type, title, detail), else None.
    error: dict[str, Any] | None = None
    links: dict[str, Any] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_resource(cls, resource: Mapping[str, Any], url: str) -> Job:
        error = resource.get("error")
        return cls(
            id=str(resource["id"]),
            status=str(resource.get("status") or ""),
            url=url,
            stage=resource.get("stage"),
            progress=float(resource.get("progress") or 0.0),
            error=dict(error) if isinstance(error, Mapping) else None,
            links=dict(resource.get("links") or {}),
            data=dict(resource),
        )

    @property
    def done(self) -> bool:
        """Final: succeeded, failed or cancelled."""
        return self.status in FINAL

    @property
    def succeeded(self) -> bool:
        return self.status == "succeeded"


def poll(
    transport: Transport,
    job_url: str,
    job: dict,
    delay: float,
    timeout: float,
    on_update: Callable[[dict], Any] = lambda job: None,
) -> dict:
    """GET the job until it is final, honouring Retry-After and sending If-None-Match;
    ``on_update`` sees each state. ``WaitTimeout`` when ``timeout`` seconds ran out."""
    deadline = time.monotonic() + timeout
    etag: str | None = None
    on_update(job)
    while job["status"] not in FINAL:
        left = deadline - time.monotonic()
        if left <= 0:
            raise WaitTimeout(job, timeout, f"{transport.server}{job_url}")
        time.sleep(min(delay, left))
        headers = {"If-None-Match": etag} if etag else {}
        response = transport.send("GET", job_url, headers=headers)
        if response.status_code != 304:
            job = read_json(response)
            etag = response.headers.get("ETag")
        delay = retry_after(response, delay)
        on_update(job)
    return job
