"""Try one registered pattern on an uploaded model, without creating a job.

The upload goes through the same door as a job's (``uploads.receive_upload``: streamed
to disk under ``data_dir`` with the size limit counted as it arrives), with one rule
more: the model must be self-contained. An upload with ``data`` parts is refused here;
a model that refers to external data is refused by the sandbox, which reads it without
external data, so this endpoint never reads a file other than the model.

Everything that touches the model runs in a sandbox
(``model_work.run_model_child``, task ``trial`` of ``app.services.api_sandbox``) with
time, CPU and memory limits: the checks of ``model_checks.inspect_model`` (sizes, op
domains), the pre-passes a job runs (constant folding, shape inference) and the match
against the one pattern. Every match (node names) and every near miss (nodes and the
reason) come back; a model that hangs or explodes there fails its own request with a
422, and the API keeps answering.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_factory
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import PatternRecord
from autofusion.app.services import registry
from autofusion.app.services.model_work import run_model_child
from autofusion.app.services.uploads import IncomingBody, receive_upload, remove_folder
from autofusion.fusion_core.patterns import NearMiss

__all__ = ["LISTED", "PatternTrial", "read_pattern", "trial_upload"]

LISTED = 1000  # matches and near misses returned in full up to this many each


@dataclass(frozen=True)
class PatternTrial:
    pattern: str
    version: int
    enabled: bool
    model_nodes: int
    prepasses: list[str]
    matches: list[list[str]]
    near_misses: list[NearMiss]
    # The first matches drawn among their neighbours (SVG), when the caller asked.
    pictures: list[str] = field(default_factory=list)


class _TenantTrials:
    """How many trials each tenant runs at once in this process: a tenant that sends
    hanging models keeps its own trials busy, not everyone's ``/test``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: Counter[str] = Counter()

    @contextmanager
    def hold(self, tenant: str | None, settings: Settings) -> Iterator[None]:
        key = tenant or ""
        limit = settings.max_concurrent_trials_per_tenant
        with self._lock:
            if self._running[key] >= limit:
                retry = max(1, round(settings.api_sandbox_time_limit_s / 4))
                busy = ProblemError(
                    429,
                    "too-many-trials",
                    "Too many pattern trials",
                    f"this tenant has {limit} pattern trial(s) running, the limit per tenant "
                    f"(max_concurrent_trials_per_tenant); retry in {retry} s",
                    headers={"Retry-After": str(retry)},
                )
                raise busy
            self._running[key] += 1
        try:
            yield
        finally:
            with self._lock:
                self._running[key] -= 1


_trials = _TenantTrials()


def read_pattern(settings: Settings, name: str) -> PatternRecord:
    """The pattern, read in a session held only for the read: a trial holds none."""
    with session_factory(settings.resolved_database_url)() as session:
        return registry.get_pattern(session, name)


async def trial_upload(
    body: IncomingBody,
    settings: Settings,
    record: PatternRecord,
    *,
    pictures: int = 0,
    tenant: str | None = None,
) -> PatternTrial:
    """Receive the multipart upload (one ``model`` part) and try ``record`` on it in a
    sandbox; ``pictures`` asks for SVGs of that many first matches. The upload
    holds one of ``tenant``'s upload slots while it streams."""
    with _trials.hold(tenant, settings):
        return await _try_upload(body, settings, record, pictures, tenant)


async def _try_upload(
    body: IncomingBody, settings: Settings, record: PatternRecord, pictures: int, tenant: str | None
) -> PatternTrial:
    upload = await receive_upload(body, settings, tenant=tenant)
    try:
        if upload.data_names or upload.config_text is not None:
            raise ProblemError(
                422,
                "invalid-upload",
                "Invalid upload",
                "this endpoint takes one 'model' part and nothing else (no 'data' or 'config')",
            )
        pattern = {
            "name": record.name,
            "version": record.version,
            "enabled": record.enabled,
            "spec": record.spec,
        }
        request_body = {
            "model": str(upload.model_path.resolve()),
            "pattern": pattern,
            "pictures": pictures,
        }
        found = await run_model_child(
            "trial",
            request_body,
            settings,
            what="the pattern trial",
            client_gone=body.gone,
            owner=upload.owner,
        )
    finally:
        await asyncio.to_thread(remove_folder, upload.folder)
    return PatternTrial(
        pattern=record.name,
        version=record.version,
        enabled=record.enabled,
        model_nodes=found["model_nodes"],
        prepasses=found["prepasses"],
        matches=found["matches"],
        near_misses=[
            NearMiss(record.name, tuple(miss["nodes"]), miss["reason"])
            for miss in found["near_misses"]
        ],
        pictures=found["pictures"],
    )
