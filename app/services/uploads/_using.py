"""``POST /v1/optimize``'s ``data_upload`` fields: complete data uploads of the tenant
that join the job's data files under their names, as if sent as ``data`` parts.

The upload checks (``inspect_upload``: each external-data location a plain uploaded
file, no link, each tensor's range inside the file) read a data file's size and kind,
never its bytes. So the file is not copied from the store for them: the upload folder
gets a sparse file of the same name and size in its place (``place_data_uploads``),
which the checks see as they see a ``data`` part, links and all, at no cost in disk or
time whatever the file's size. The job refers to the upload's blob by its digest.

The uploads are read when the form has arrived, and again in the job's own transaction
(``recheck_data_uploads``), locked against a delete until it commits: a blob a job is
about to refer to cannot lose its last reference in between, and the blob sweeper sees
one or the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import DataUpload, DataUploadStatus, as_utc, utcnow
from autofusion.app.services.uploads._form import DATA_UPLOAD_FIELD, Upload, bad_upload
from autofusion.app.services.uploads._staged import is_upload_id

__all__ = ["DataUploadFile", "place_data_uploads", "read_data_uploads", "recheck_data_uploads"]


@dataclass(frozen=True)
class DataUploadFile:
    """A complete data upload named by a ``data_upload`` field."""

    id: str
    name: str
    digest: str
    size: int


def _unusable(upload_id: str, why: str) -> ProblemError:
    return bad_upload(
        f"data_upload {upload_id[:80]!r} {why}; name a complete data upload of this tenant "
        "(POST /v1/uploads, then PATCH its bytes until its status is complete), or send "
        "the file as a 'data' part",
        DATA_UPLOAD_FIELD,
    )


def _usable(row: DataUpload | None, upload_id: str, tenant_id: str) -> DataUploadFile:
    if row is None or row.tenant_id != tenant_id:
        raise _unusable(upload_id, "is not a data upload of this tenant (or it expired)")
    if row.status != DataUploadStatus.complete.value or row.digest is None:
        raise _unusable(upload_id, f"is not complete: it has {row.received} of {row.size} bytes")
    if as_utc(row.expires_at) <= utcnow():
        raise _unusable(upload_id, "has expired")
    return DataUploadFile(row.id, row.name, row.digest, row.size)


def read_data_uploads(
    settings: Settings, tenant_id: str, upload_ids: Sequence[str]
) -> list[DataUploadFile]:
    """The uploads the ids name, each complete and the tenant's; 422 otherwise, and for
    an upload named twice or two of one name."""
    if len(set(upload_ids)) != len(upload_ids):
        twice = next(i for i in upload_ids if upload_ids.count(i) > 1)
        raise bad_upload(f"data_upload {twice[:80]!r} is named twice", DATA_UPLOAD_FIELD)
    files = []
    with session_scope(settings.resolved_database_url) as session:
        for upload_id in upload_ids:
            row = session.get(DataUpload, upload_id) if is_upload_id(upload_id) else None
            files.append(_usable(row, upload_id, tenant_id))
    names = [f.name for f in files]
    for name in names:
        if names.count(name) > 1:
            raise bad_upload(
                f"two data uploads are named {name!r}; data file names must differ",
                DATA_UPLOAD_FIELD,
            )
    return files


def place_data_uploads(upload: Upload, files: Sequence[DataUploadFile]) -> None:
    """A sparse file of each upload's name and size in the upload folder, for the checks
    (see the module docstring); 422 for a name a ``data`` part or the model has."""
    taken = {*upload.data_names, upload.model_path.name}
    for file in files:
        if file.name in taken:
            raise bad_upload(
                f"data_upload {file.id} is named {file.name!r}, as a 'data' part or the "
                "model is; file names must differ",
                DATA_UPLOAD_FIELD,
            )
        # "xb": a fresh folder holds only what we write, never a link planted beforehand.
        with open(upload.folder / file.name, "xb") as placeholder:
            placeholder.truncate(file.size)


def recheck_data_uploads(session: Session, tenant_id: str, files: Sequence[DataUploadFile]) -> None:
    """In the job's transaction: the uploads are still there, complete, the same file;
    each row locked (PostgreSQL: FOR KEY SHARE; SQLite's write lock covers it) until the
    job commits, so a delete waits for the job's reference to exist."""
    if not files:
        return
    query = (
        select(DataUpload)
        .where(DataUpload.id.in_([f.id for f in files]))
        .with_for_update(read=True, key_share=True)
    )
    rows = {row.id: row for row in session.scalars(query)}
    for file in files:
        current = _usable(rows.get(file.id), file.id, tenant_id)
        if current.digest != file.digest:  # pragma: no cover - a complete upload never changes
            raise _unusable(file.id, "changed while the request was checked")
