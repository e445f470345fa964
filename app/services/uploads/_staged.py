"""Data uploads (issue 29): one big external-data file, sent in parts, resumable.

``POST /v1/uploads`` makes the row (``create_data_upload``: the name, the declared size,
the tenant's room reserved); each ``PATCH`` adds a part (``_parts.py``); the last part
makes the whole file one blob of the store, and ``POST /v1/optimize``'s ``data_upload``
field names it (``_using.py``). This module holds the rows: their public form, reads,
deletes, and what retention asks of them (expiry, the blobs they refer to).

Where the bytes live while they arrive: as *parts*, blobs of the artifact store listed
on the row. Several API processes that share no disk (distributed mode) can each take a
PATCH, and the S3 store works as the local one does. A part's blob begins with a header
naming its upload, offset, revision and request (``part_header``), so no other upload,
job or request can hold the same bytes: a part belongs to its PATCH alone and is deleted
the moment the upload no longer lists it, without the sweeper's grace that shared blobs
need.
"""

from __future__ import annotations

import logging
import math
import re
import uuid
from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import DataUpload, DataUploadStatus, as_utc, utcnow
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.quotas import Quotas, check_new_upload, lock_tenant
from autofusion.app.services.uploads._form import check_file_name, too_large

__all__ = [
    "UPLOADS_PATH",
    "DataUploadCreate",
    "DataUploadPublic",
    "create_data_upload",
    "delete_data_upload",
    "drop_parts",
    "expire_data_uploads",
    "get_data_upload",
    "is_upload_id",
    "part_header",
    "public_view",
    "upload_digests",
    "upload_not_found",
]

logger = logging.getLogger(__name__)

UPLOADS_PATH = "/v1/uploads"
_INT64_MAX = 2**63 - 1
_BATCH = 200
_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class DataUploadCreate(BaseModel):
    """``POST /v1/uploads``: the data file to come."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(
        min_length=1,
        max_length=255,
        description="The file's plain name, as the model's external-data locations name it.",
        examples=["model.onnx.data"],
    )
    size: int = Field(
        ge=1, le=_INT64_MAX, description="Its length in bytes (at most max_data_file_bytes)."
    )
    sha256: str | None = Field(
        default=None,
        pattern="^[0-9a-fA-F]{64}$",
        description="Its sha256, hex: the server checks the whole file against it.",
    )


class DataUploadLinks(BaseModel):
    self: str


class DataUploadPublic(BaseModel):
    """A data upload: ``receiving`` until ``received`` reaches ``size``, then ``complete``
    with ``digest``, the sha256 of the file, for ``POST /v1/optimize``'s ``data_upload``."""

    id: str
    name: str
    size: int
    received: int
    sha256: str | None
    digest: str | None
    status: Literal["receiving", "complete"]
    created_at: datetime
    expires_at: datetime
    links: DataUploadLinks


def public_view(row: DataUpload) -> DataUploadPublic:
    return DataUploadPublic(
        id=row.id,
        name=row.name,
        size=row.size,
        received=row.received,
        sha256=row.sha256,
        digest=row.digest,
        status=row.status,
        created_at=as_utc(row.created_at),
        expires_at=as_utc(row.expires_at),
        links=DataUploadLinks(self=f"{UPLOADS_PATH}/{row.id}"),
    )


def part_header(upload_id: str, offset: int, revision: int) -> bytes:
    """The bytes a part's blob begins with: its own, whatever the file holds. A token of
    its request too: two PATCHes of one offset that read one revision (a client that
    retried while the server still kept its cut chunk) may carry the same bytes, and
    the loser drops its part's blob, which must not be the winner's."""
    token = uuid.uuid4().hex
    return f"autofusion data upload part\n{upload_id} {offset} {revision} {token}\n".encode()


def is_upload_id(text: str) -> bool:
    """Whether ``text`` has the shape of an upload's id (a uuid): anything else is no
    upload, without a query (a NUL byte would be PostgreSQL's error, not a 404)."""
    return _ID.fullmatch(text) is not None


def upload_not_found(upload_id: str) -> ProblemError:
    return ProblemError(
        404,
        "upload-not-found",
        "Upload not found",
        f"there is no data upload {upload_id!r} (it may have expired or been deleted): "
        "start a new one with POST /v1/uploads",
    )


def create_data_upload(
    session: Session, tenant_id: str, body: DataUploadCreate, settings: Settings
) -> tuple[DataUploadPublic, bool]:
    """Insert the tenant's new upload, or find the one it has of the same file (name,
    size, sha256; still receiving or complete, not expired): a client that lost the
    answer to its POST, or started again after a crash, resumes where the bytes stand
    instead of leaving an orphan that holds its size of the quota. Whether it was made
    here. 413 over ``max_data_file_bytes``, 422 for a name that is not a plain file name,
    429/507 over the tenant's quotas. Flushed: the caller commits."""
    check_file_name(body.name, "name", what=f"the upload's name {body.name!r}")
    limit = settings.max_data_file_bytes
    if body.size > limit:
        raise too_large(
            f"the data file is {body.size} bytes; this server takes data files of at most "
            f"{limit} bytes (max_data_file_bytes)",
            limit,
        )
    lock_tenant(session, tenant_id)  # with check_new_upload: racing creates take turns
    same = _same_file(session, tenant_id, body)
    if same is not None:
        return public_view(same), False
    now = utcnow()
    row = DataUpload(
        id=str(uuid.uuid4()),
        tenant_id=tenant_id,
        name=body.name,
        size=body.size,
        received=0,
        sha256=body.sha256.lower() if body.sha256 else None,
        parts=[],
        status=DataUploadStatus.receiving.value,
        revision=1,
        created_at=now,
        expires_at=now + timedelta(seconds=settings.upload_expiry_s),
    )
    session.add(row)
    session.flush()
    check_new_upload(session, Quotas.from_settings(settings), tenant_id, body.size)
    return public_view(row), True


def _same_file(session: Session, tenant_id: str, body: DataUploadCreate) -> DataUpload | None:
    """The tenant's newest live upload of this very file; none without a sha256 (a
    name and a size do not say it is the same file)."""
    if not body.sha256:
        return None
    return session.scalars(
        select(DataUpload)
        .where(
            DataUpload.tenant_id == tenant_id,
            DataUpload.name == body.name,
            DataUpload.size == body.size,
            DataUpload.sha256 == body.sha256.lower(),
            DataUpload.expires_at > utcnow(),
        )
        .order_by(DataUpload.created_at.desc())
        .limit(1)
    ).first()


def get_data_upload(session: Session, tenant_id: str, upload_id: str) -> DataUpload:
    """The tenant's upload; 404 for another tenant's, as for one that does not exist."""
    row = session.get(DataUpload, upload_id) if is_upload_id(upload_id) else None
    if row is None or row.tenant_id != tenant_id:
        raise upload_not_found(upload_id)
    return row


def delete_data_upload(
    settings: Settings, store: ArtifactStore, tenant_id: str, upload_id: str
) -> None:
    """Delete the tenant's upload and its parts. A complete upload's file stays while a
    job refers to it; otherwise retention removes it (a blob of shared bytes)."""
    with session_scope(settings.resolved_database_url) as session:
        row = get_data_upload(session, tenant_id, upload_id)
        parts = list(row.parts or [])
        session.execute(
            delete(DataUpload)
            .where(DataUpload.id == row.id)
            .execution_options(synchronize_session=False)
        )
    drop_parts(store, parts)  # after the commit: no row lists them any more


def drop_parts(store: ArtifactStore, parts: Iterable[dict[str, Any]]) -> None:
    """Delete parts no row lists any more. Their bytes are their upload's alone (see the
    module docstring), so no grace: whenever they were stored, they go."""
    for part in parts:
        try:
            store.delete(part["digest"], stored_before=math.inf)
        except Exception as exc:  # left in the store: the blob sweeper takes it later
            logger.warning("data uploads: could not remove part %s: %s", part.get("digest"), exc)


def expire_data_uploads(settings: Settings, store: ArtifactStore, now: datetime) -> list[str]:
    """Delete the uploads past ``expires_at`` and their parts; the ids deleted. Each
    delete is conditional on the revision read, so a PATCH that just moved the expiry
    on keeps its upload."""
    deleted: list[str] = []
    while True:
        parts: list[dict[str, Any]] = []
        with session_scope(settings.resolved_database_url) as session:
            rows = session.execute(
                select(DataUpload.id, DataUpload.revision, DataUpload.parts)
                .where(DataUpload.expires_at < now)
                .order_by(DataUpload.expires_at)
                .limit(_BATCH)
            ).all()
            for upload_id, revision, row_parts in rows:
                gone = session.execute(
                    delete(DataUpload)
                    .where(DataUpload.id == upload_id, DataUpload.revision == revision)
                    .execution_options(synchronize_session=False)
                )
                if gone.rowcount == 1:
                    deleted.append(upload_id)
                    parts += row_parts or []
        drop_parts(store, parts)
        if len(rows) < _BATCH:
            return deleted


def upload_digests(session: Session, digests: list[str]) -> set[str]:
    """Those of ``digests`` a data upload refers to: a complete one's file, or a part of
    one still receiving (for the blob sweeper: never removed while the upload lives)."""
    wanted = set(digests)
    found: set[str] = set()
    for start in range(0, len(digests), 500):
        chunk = digests[start : start + 500]
        found |= set(session.scalars(select(DataUpload.digest).where(DataUpload.digest.in_(chunk))))
    receiving = select(DataUpload.parts).where(
        DataUpload.status == DataUploadStatus.receiving.value
    )
    for parts in session.scalars(receiving):
        found |= {part["digest"] for part in parts or []} & wanted
    return found
