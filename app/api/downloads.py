"""A job's stored file as an HTTP response: ``GET``, ``HEAD`` and conditional ``GET``.

The API's download routes and the dashboard's answer through ``download_response``.
Every answer carries the file's strong ``ETag`` and ``Repr-Digest`` (its sha256, known
from the store's address without reading the file): ``If-None-Match`` with that ETag is
a ``304`` with no body, and a ``HEAD`` sends a ``GET``'s headers (``Content-Length``
too) with no body, without fetching the file. The streamed files (the model) also
answer ``Range`` requests (Starlette's ``FileResponse``: ``Accept-Ranges: bytes``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request, Response
from fastapi.responses import FileResponse
from sqlalchemy.orm import Session
from starlette.background import BackgroundTask
from starlette.types import Message, Receive, Scope, Send

from autofusion.app.core.config import Settings
from autofusion.app.core.models import Job
from autofusion.app.services import job_files
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.auth import Principal
from autofusion.app.services.job_files import JobFile
from autofusion.app.services.jobs import get_job

__all__ = ["JobDownloads", "download_response", "etag_matches"]

# What a 304 keeps of a 200's headers (RFC 9110, 15.4.5).
_NOT_MODIFIED_HEADERS = ("ETag", "Cache-Control", "Last-Modified")


def etag_matches(if_none_match: str | None, etag: str) -> bool:
    """RFC 9110 ``If-None-Match``: ``*`` or a list holding ``etag`` (weak comparison)."""
    if not if_none_match:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in tags or etag in tags


def download_response(
    request: Request, file: JobFile, store: ArtifactStore, scratch: Path
) -> Response:
    """``file`` as the answer to ``request``; ``scratch`` holds a streamed file's
    temporary copy for as long as the response sends it. It reads the store: call it
    from a worker thread (a sync route)."""
    headers = file.headers()
    if file.stream:
        headers["Accept-Ranges"] = "bytes"
    if etag_matches(request.headers.get("if-none-match"), file.etag):
        return Response(
            status_code=304, headers={name: headers[name] for name in _NOT_MODIFIED_HEADERS}
        )
    if request.method == "HEAD":
        size = store.size(file.digest)
        headers["Content-Length"] = str(size)
        return Response(status_code=200, media_type=file.media_type, headers=headers)
    if file.stream:
        path = job_files.temporary_copy(file, store, scratch)
        return _CopyResponse(
            path,
            media_type=file.media_type,
            headers=headers,
            background=BackgroundTask(path.unlink, missing_ok=True),
            stat_result=os.stat(path),  # ETag, Last-Modified: ours, not the copy's
        )
    body = store.read_bytes(file.digest)
    return Response(body, media_type=file.media_type, headers=headers)


class _CopyResponse(FileResponse):
    """A temporary copy as a FileResponse. Where Starlette refuses the Range (400, 416)
    it answers and returns before the background task: the copy is removed here then."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refused = False

        async def watch(message: Message) -> None:
            nonlocal refused
            if message["type"] == "http.response.start" and message["status"] in (400, 416):
                refused = True
            await send(message)

        try:
            await super().__call__(scope, receive, watch)
        finally:
            if refused and self.background is not None:
                await self.background()


@dataclass(frozen=True)
class JobDownloads:
    """What a download route needs, the API's (a key) and the dashboard's (a cookie)
    alike: the caller's job, and the answer for one of its files. Each side builds it
    with its own principal dependency."""

    request: Request
    principal: Principal
    session: Session
    settings: Settings
    store: ArtifactStore

    def job(self, job_id: str) -> Job:
        return get_job(self.session, self.principal.tenant_id, job_id)

    def send(self, file: JobFile) -> Response:
        scratch = self.settings.data_dir / "downloads"
        return download_response(self.request, file, self.store, scratch)
