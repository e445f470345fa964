"""Server-sent events for one job: the row is polled, not the broker.

Each time the job's revision changes the stream sends ``event: progress`` with the job
JSON (``id:`` is the revision, so a client reconnecting with ``Last-Event-ID`` skips what
it has seen); when the job ends it sends ``event: done`` with the final job and closes.
A comment line every ``HEARTBEAT_S`` keeps proxies from closing an idle stream.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable

from autofusion.app.core.db import session_scope
from autofusion.app.core.job_records import JobPublic
from autofusion.app.core.models import Job, JobStatus

__all__ = ["HEARTBEAT_S", "job_events", "sse_message"]

HEARTBEAT_S = 15.0


def sse_message(event: str, data: dict, event_id: int | None = None) -> str:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.append(f"data: {json.dumps(data, separators=(',', ':'))}")
    return "\n".join(lines) + "\n\n"


def _read_job(database_url: str, tenant_id: str, job_id: str) -> JobPublic | None:
    with session_scope(database_url) as session:
        job = session.get(Job, job_id)
        if job is None or job.tenant_id != tenant_id:
            return None
        return JobPublic.from_job(job)


async def job_events(
    database_url: str,
    tenant_id: str,
    job_id: str,
    *,
    poll_s: float,
    last_revision: int | None = None,
    is_disconnected: Callable[[], object] | None = None,
) -> AsyncIterator[str]:
    """Yield SSE messages until the job is final (or the client goes away)."""
    last_sent = time.monotonic()
    while True:
        if is_disconnected is not None and await is_disconnected():
            return
        job = await asyncio.to_thread(_read_job, database_url, tenant_id, job_id)
        if job is None:
            return
        body = job.model_dump(mode="json")
        if job.revision != last_revision:
            last_revision = job.revision
            last_sent = time.monotonic()
            yield sse_message("progress", body, job.revision)
        if JobStatus(job.status).is_final:
            yield sse_message("done", body, job.revision)
            return
        if time.monotonic() - last_sent >= HEARTBEAT_S:
            last_sent = time.monotonic()
            yield ": keep-alive\n\n"
        await asyncio.sleep(poll_s)
