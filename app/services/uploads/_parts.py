"""The parts of a data upload (``PATCH /v1/uploads/{id}``), and the whole file they make.

A PATCH starts at the upload's ``received`` offset (else 409 with the offset). Its body
streams to a scratch file behind a header of its own (``part_header``), never into
memory and never past the upload's size (413), and is stored as a blob of the artifact
store; a compare-and-set on the row's revision then lists it. Whatever arrived before a
client left, or before a body timed out, is kept that way too: the client asks ``HEAD``
for the offset and sends the rest.

When ``received`` reaches ``size``, the parts are read back in order into one file,
hashed as they go; a hash that is not the declared sha256 drops them all (422, the
client starts over), else the file is stored as one blob (its ``digest``) and the parts
are deleted. The request that sent the last byte does this, and answers with the
complete upload; one that finds ``received == size`` but no ``digest`` (that request
died) does it again. A part the row lists that is gone from the store (or short) can
never make the file: the upload drops its parts and starts again from 0 (409 with
``Upload-Offset: 0``), instead of failing every try after.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, BinaryIO

from sqlalchemy import update

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import DataUpload, DataUploadStatus, utcnow
from autofusion.app.services import scratch
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.uploads._receive import (
    ClientGone,
    IncomingBody,
    _slot_owner,
    remove_folder,
)
from autofusion.app.services.uploads._staged import (
    DataUploadPublic,
    drop_parts,
    get_data_upload,
    part_header,
    public_view,
)

__all__ = ["OFFSET_MEDIA_TYPE", "offset_mismatch", "receive_part"]

logger = logging.getLogger(__name__)

OFFSET_MEDIA_TYPE = "application/offset+octet-stream"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class _Snapshot:
    """An upload's row as read at one revision (what a compare-and-set compares)."""

    row: DataUploadPublic
    tenant_id: str
    revision: int
    parts: tuple[dict[str, Any], ...]

    @property
    def id(self) -> str:
        return self.row.id


def _snapshot(row: DataUpload) -> _Snapshot:
    return _Snapshot(public_view(row), row.tenant_id, row.revision, tuple(row.parts or ()))


def _read(settings: Settings, tenant_id: str, upload_id: str) -> _Snapshot:
    with session_scope(settings.resolved_database_url) as session:
        return _snapshot(get_data_upload(session, tenant_id, upload_id))


def offset_mismatch(current: DataUploadPublic, offset: int) -> ProblemError:
    return ProblemError(
        409,
        "upload-offset-mismatch",
        "Upload offset mismatch",
        f"this PATCH starts at byte {offset}, but data upload {current.id} has "
        f"{current.received} of its {current.size} bytes: send the bytes from "
        f"{current.received} on, with Upload-Offset: {current.received} (HEAD "
        f"/v1/uploads/{current.id} says where it stands)",
        headers={"Upload-Offset": str(current.received)},
        offset=current.received,
    )


def _past_size(current: DataUploadPublic, body: str) -> ProblemError:
    return ProblemError(
        413,
        "payload-too-large",
        "Payload too large",
        f"data upload {current.id} is {current.size} bytes and has {current.received}; "
        f"{body} would take it past its size: send at most {current.size - current.received} "
        "more bytes (nothing of this PATCH was kept)",
        headers={"Upload-Offset": str(current.received)},
        limit=current.size - current.received,
    )


def _check_media_type(content_type: str | None) -> None:
    if (content_type or "").split(";")[0].strip().lower() != OFFSET_MEDIA_TYPE:
        raise ProblemError(
            415,
            "unsupported-media-type",
            "Unsupported media type",
            f"send the bytes of a data upload as {OFFSET_MEDIA_TYPE} (curl -H 'Content-Type: "
            f"{OFFSET_MEDIA_TYPE}' --data-binary @file), not {content_type or 'no type'}",
        )


def _declared(content_length: str | None) -> int | None:
    text = (content_length or "").strip()
    return int(text) if text.isascii() and text.isdigit() else None


async def receive_part(
    body: IncomingBody,
    settings: Settings,
    store: ArtifactStore,
    *,
    tenant_id: str,
    upload_id: str,
    offset: int,
) -> DataUploadPublic:
    """``PATCH /v1/uploads/{id}``: add the body at ``offset``; the upload as it is then
    (``complete`` once the last byte is in and the file checked and stored)."""
    _check_media_type(body.content_type)
    start = await asyncio.to_thread(_read, settings, tenant_id, upload_id)
    if offset != start.row.received:
        raise offset_mismatch(start.row, offset)
    room = start.row.size - start.row.received
    declared = _declared(body.content_length)
    if declared is not None and declared > room:
        raise _past_size(start.row, f"a body of {declared} bytes")
    with body.slots.hold(_slot_owner(tenant_id, body, settings)):
        now = await _receive(body.chunks, settings, store, start, room)
    full = now.row.received == now.row.size
    if full and now.row.status == DataUploadStatus.receiving.value:
        return await asyncio.to_thread(_complete, settings, store, now)
    return now.row


class _PartFile:
    """The scratch file of one PATCH's part: its header, then the body, counted."""

    def __init__(self, path: Path, header: bytes, room: int) -> None:
        self.path, self.skip, self.room = path, len(header), room
        self.size = 0  # body bytes on disk
        self._pending = bytearray()
        self._file: BinaryIO | None = open(path, "xb")  # noqa: SIM115 (closed in close)
        self._file.write(header)

    @property
    def received(self) -> int:
        return self.size + len(self._pending)

    async def add(self, chunk: bytes) -> None:
        if self.received + len(chunk) > self.room:
            raise _PastSize
        self._pending += chunk
        if len(self._pending) >= _CHUNK:
            await asyncio.to_thread(self.flush)

    def flush(self) -> None:
        if self._pending and self._file is not None:
            self._file.write(self._pending)
            self.size += len(self._pending)
            self._pending.clear()

    def close(self) -> None:
        self.flush()
        if self._file is not None:
            self._file.close()
            self._file = None


class _PastSize(Exception):
    """More bytes than the upload has room for."""


async def _receive(
    chunks: AsyncIterator[bytes],
    settings: Settings,
    store: ArtifactStore,
    start: _Snapshot,
    room: int,
) -> _Snapshot:
    """Stream the body into a part and list it; what arrived is kept whatever stops the
    body (the client left, a body limit), except bytes past the size."""
    folder = _scratch_folder(settings)
    part = _PartFile(
        folder / "part", part_header(start.id, start.row.received, start.revision), room
    )
    try:
        try:
            async for chunk in chunks:
                await part.add(chunk)
        except _PastSize:
            raise _past_size(start.row, "this PATCH's body") from None
        except BaseException as exc:
            part.close()
            if part.size:  # shielded: a cancelled request still keeps what it had
                keep = asyncio.to_thread(_commit_part, settings, store, start, part)
                await asyncio.shield(keep)
            if isinstance(exc, ClientGone):
                raise ProblemError(
                    400, "upload-incomplete", "Upload incomplete", "the client disconnected"
                ) from None
            raise
        part.close()
        if not part.size:
            return start
        return await asyncio.to_thread(_commit_part, settings, store, start, part)
    finally:
        part.close()
        await asyncio.to_thread(remove_folder, folder)


def _scratch_folder(settings: Settings) -> Path:
    folder = settings.uploads_dir / uuid.uuid4().hex
    folder.mkdir(parents=True)
    scratch.claim(folder)  # released by remove_folder: the sweeper leaves it alone meanwhile
    return folder


def _swap(settings: Settings, start: _Snapshot, **values: Any) -> _Snapshot | None:
    """Write ``values`` (the revision moved on, the expiry too) if the row is still at
    ``start``'s revision; the row after, or None when another request changed it first."""
    expires = utcnow() + timedelta(seconds=settings.upload_expiry_s)
    with session_scope(settings.resolved_database_url) as session:
        result = session.execute(
            update(DataUpload)
            .where(DataUpload.id == start.id, DataUpload.revision == start.revision)
            .values(revision=start.revision + 1, expires_at=expires, **values)
            .execution_options(synchronize_session=False)
        )
        if result.rowcount != 1:
            return None
        return _snapshot(session.get(DataUpload, start.id))


def _commit_part(
    settings: Settings, store: ArtifactStore, start: _Snapshot, part: _PartFile
) -> _Snapshot:
    listed = {"digest": store.put_file(part.path), "size": part.size, "skip": part.skip}
    after = _swap(
        settings, start, received=start.row.received + part.size, parts=[*start.parts, listed]
    )
    if after is not None:
        return after
    drop_parts(store, [listed])  # another PATCH of the same offset won: its bytes stand
    current = _read(settings, start.tenant_id, start.id)  # 404 if deleted meanwhile
    raise offset_mismatch(current.row, start.row.received)


def _complete(settings: Settings, store: ArtifactStore, full: _Snapshot) -> DataUploadPublic:
    """The parts as one file: checked against the declared sha256, stored, listed."""
    folder = _scratch_folder(settings)
    try:
        try:
            digest = _assemble(store, full.parts, folder / "file", folder / "piece")
        except Exception as exc:
            settled = _unassembled(settings, store, full, exc)
            if settled is None:
                raise
            return settled
        declared = full.row.sha256
        if declared is not None and digest != declared:
            if _swap(settings, full, received=0, parts=[]) is not None:
                drop_parts(store, full.parts)
            raise _digest_mismatch(full.row, digest)
        store.put_file(folder / "file")
    finally:
        remove_folder(folder)
    done = _swap(settings, full, status=DataUploadStatus.complete.value, digest=digest, parts=[])
    if done is None:
        return _changed_meanwhile(settings, full)
    drop_parts(store, full.parts)
    return done.row


def _changed_meanwhile(settings: Settings, full: _Snapshot) -> DataUploadPublic:
    """Another request moved the upload on from ``full``: complete, the upload (its last
    PATCH's answer); else 409 with where it stands now (404 if it was deleted)."""
    current = _read(settings, full.tenant_id, full.id)
    if current.row.status == DataUploadStatus.complete.value:
        return current.row
    raise offset_mismatch(current.row, full.row.received)


def _unassembled(
    settings: Settings, store: ArtifactStore, full: _Snapshot, exc: Exception
) -> DataUploadPublic | None:
    """Why the parts could not be read back. Another request completed, reset or deleted
    the upload meanwhile: as ``_changed_meanwhile``. A part the row still lists is gone
    or short: no later try can succeed, so the upload starts again from 0 (409). None
    for anything else (a store that failed for now: the client's retry completes it)."""
    if _read(settings, full.tenant_id, full.id).revision != full.revision:
        return _changed_meanwhile(settings, full)
    lost = [p["digest"] for p in full.parts if not store.exists(p["digest"])]
    if not lost and not isinstance(exc, _PartLost):
        return None
    if _swap(settings, full, received=0, parts=[]) is None:
        return _changed_meanwhile(settings, full)
    logger.warning(
        "data upload %s cannot be put together (%s; parts missing from the store: %s): "
        "its parts are dropped and it starts again from 0",
        full.id,
        exc,
        lost,
    )
    drop_parts(store, full.parts)
    raise _parts_lost(full.row)


class _PartLost(OSError):
    """A part's blob holds fewer bytes than its listing says."""


def _assemble(
    store: ArtifactStore, parts: tuple[dict[str, Any], ...], out: Path, piece: Path
) -> str:
    """Write the parts' bytes (each past its header) to ``out``, in order; their sha256."""
    digest = hashlib.sha256()
    with open(out, "xb") as target:
        for part in parts:
            store.fetch_for_reading(part["digest"], piece)  # a local store: a link, no copy
            try:
                with open(piece, "rb") as source:
                    source.seek(part["skip"])
                    left = part["size"]
                    while left:
                        chunk = source.read(min(_CHUNK, left))
                        if not chunk:
                            raise _PartLost(f"part {part['digest']} is shorter than listed")
                        digest.update(chunk)
                        target.write(chunk)
                        left -= len(chunk)
            finally:
                piece.unlink(missing_ok=True)
    return digest.hexdigest()


def _parts_lost(row: DataUploadPublic) -> ProblemError:
    return ProblemError(
        409,
        "upload-parts-lost",
        "Upload parts lost",
        f"data upload {row.id} had all its {row.size} bytes, but some of them are no longer "
        "in the server's store, so the file cannot be put together; what it had was "
        "dropped: send the file again from its start (PATCH with Upload-Offset: 0)",
        headers={"Upload-Offset": "0"},
        offset=0,
    )


def _digest_mismatch(row: DataUploadPublic, digest: str) -> ProblemError:
    return ProblemError(
        422,
        "upload-digest-mismatch",
        "Upload digest mismatch",
        f"the {row.size} bytes data upload {row.id} received have sha256 {digest}, not "
        f"{row.sha256} as declared when it began; they were dropped: send the file again "
        "from its start (PATCH with Upload-Offset: 0), or start a new upload if the file "
        "changed",
        headers={"Upload-Offset": "0"},
        sha256=digest,
        expected_sha256=row.sha256,
    )
