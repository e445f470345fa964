"""Accepting an upload: its options checked, the model inspected, its files stored; then
the job created, once, whatever retries the client sends with one Idempotency-Key.

``create_job_for_upload`` commits: it inserts or reads the job of an idempotency key, and a
concurrent request with the same key must see the row (tests/test_layout.py lists it).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.job_records import OptimizeOptions
from autofusion.app.core.models import Job, Strategy
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.auth import Principal
from autofusion.app.services.jobs import check_pattern_names, create_job
from autofusion.app.services.model_work import inspect_upload
from autofusion.app.services.quotas import Quotas
from autofusion.app.services.uploads._form import Upload, invalid_config
from autofusion.app.services.uploads._receive import IncomingBody, receive_upload, remove_folder
from autofusion.app.services.uploads._using import (
    DataUploadFile,
    place_data_uploads,
    read_data_uploads,
    recheck_data_uploads,
)
from autofusion.app.services.webhooks import attach_callback, check_callback_url
from autofusion.fusion_core.errors import describe_fields, field_errors

__all__ = [
    "StoredUpload",
    "accept_received",
    "accept_upload",
    "create_job_for_upload",
    "parse_options",
    "store_upload",
]


@dataclass(frozen=True)
class StoredUpload:
    """An accepted upload: its blobs are in the artifact store, its folder is gone."""

    model_name: str
    model_digest: str
    data_files: list[dict[str, str]]
    options: OptimizeOptions
    # Each stored blob's size by digest: what the job adds to its tenant's stored bytes.
    sizes: dict[str, int] = field(default_factory=dict)
    # The data uploads among the data files ('data_upload' fields), checked again when
    # the job is written.
    data_uploads: tuple[DataUploadFile, ...] = ()


def parse_options(text: str | None) -> OptimizeOptions:
    """The ``config`` form field as ``OptimizeOptions``; errors name the field."""
    if text is None or not text.strip():
        return OptimizeOptions()
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise invalid_config("config", f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise invalid_config("config", "must be a JSON object")
    try:
        return OptimizeOptions.model_validate(raw)
    except ValidationError as exc:
        pairs = field_errors(exc, prefix=("config",))
        errors = [{"field": f, "message": m} for f, m in pairs]
        detail = describe_fields(pairs)
        raise ProblemError(422, "invalid-config", "Invalid config", detail, errors=errors) from None


def store_upload(
    upload: Upload, store: ArtifactStore, data_uploads: Sequence[DataUploadFile] = ()
) -> tuple[str, list[dict[str, str]], dict[str, int]]:
    """Put the model and data files in the store: ``(model digest, [{name, digest}],
    {digest: size})``. ``data_uploads`` are in the store already: they join the data
    files by name, as parts of the form would."""
    paths = [upload.model_path, *(upload.folder / name for name in upload.data_names)]
    digests = [store.put_file(path) for path in paths]
    sizes = {digest: path.stat().st_size for digest, path in zip(digests, paths, strict=True)}
    data_files = [
        {"name": path.name, "digest": digest}
        for path, digest in zip(paths[1:], digests[1:], strict=True)
    ]
    data_files += [{"name": f.name, "digest": f.digest} for f in data_uploads]
    sizes |= {f.digest: f.size for f in data_uploads}
    return digests[0], sorted(data_files, key=lambda f: f["name"]), sizes


async def accept_upload(
    body: IncomingBody, settings: Settings, store: ArtifactStore, *, tenant: str | None = None
) -> StoredUpload:
    """Receive, check and store an upload (its 'data_upload' fields those of ``tenant``);
    the upload folder is gone afterwards."""
    upload = await receive_upload(body, settings, tenant=tenant, data_uploads=True)
    return await accept_received(upload, settings, store, tenant=tenant)


async def accept_received(
    upload: Upload, settings: Settings, store: ArtifactStore, *, tenant: str | None = None
) -> StoredUpload:
    """Check and store what ``receive_upload`` wrote; the upload folder is gone afterwards.
    ``tenant``: whose data uploads the 'data_upload' fields may name."""
    try:
        options = parse_options(upload.config_text)
        check_callback_url(options.callback_url, settings, "config.callback_url")
        staged = await asyncio.to_thread(_data_uploads, upload, settings, tenant)
        names = [*upload.data_names, *(f.name for f in staged)]
        # In a sandbox with its own limits (model_work): the API process parses no model.
        await inspect_upload(upload.model_path, names, settings, owner=upload.owner)
        model_digest, data_files, sizes = await asyncio.to_thread(
            store_upload, upload, store, staged
        )
    finally:
        await asyncio.to_thread(remove_folder, upload.folder)
    return StoredUpload(
        upload.model_path.name, model_digest, data_files, options, sizes, tuple(staged)
    )


def _data_uploads(upload: Upload, settings: Settings, tenant: str | None) -> list[DataUploadFile]:
    """The 'data_upload' fields' uploads, in the upload folder for the checks."""
    if not upload.data_uploads:
        return []
    if tenant is None:  # pragma: no cover - only accept_upload takes the fields
        raise ValueError("data_upload fields need the tenant whose uploads they name")
    files = read_data_uploads(settings, tenant, upload.data_uploads)
    place_data_uploads(upload, files)
    return files


def create_job_for_upload(
    session: Session,
    principal: Principal,
    stored: StoredUpload,
    *,
    idempotency_key: str | None,
    max_attempts: int,
    quotas: Quotas | None = None,
    key_ttl_s: float | None = None,
    base_url: str | None = None,
) -> tuple[Job, bool]:
    """Create (and commit) the job, or find the one this Idempotency-Key made before
    (less than ``key_ttl_s`` ago). ``quotas``: the tenant's limits, checked with the
    insert (429 or 507, nothing kept). ``base_url``: the address the request came to,
    kept with the job's callback for its message's absolute links."""
    strategy = stored.options.strategy
    if strategy is not None and session.get(Strategy, strategy) is None:
        raise invalid_config("config.strategy", f"there is no strategy named {strategy!r}")
    config = stored.options.model_dump(
        mode="json", exclude_unset=True, exclude={"strategy", "callback_url"}
    )
    check_pattern_names(session, config)  # a 422 now, not a job that fails in the worker
    arguments = {
        "model_name": stored.model_name,
        "model_digest": stored.model_digest,
        "data_files": stored.data_files,
        "config": config,
        "strategy": strategy,
        "idempotency_key": idempotency_key,
        "max_attempts": max_attempts,
        "sizes": stored.sizes,
        "quotas": quotas,
        "key_ttl_s": key_ttl_s,
    }
    try:
        job, created = create_job(session, principal, **arguments)
        if created:  # its callback (or the tenant's default), committed with the job
            recheck_data_uploads(session, principal.tenant_id, stored.data_uploads)
            attach_callback(session, job, stored.options.callback_url, base_url=base_url)
        session.commit()
    except IntegrityError:
        if not idempotency_key:
            raise
        # A concurrent request with the same key inserted first: answer with its job.
        session.rollback()
        job, created = create_job(session, principal, **arguments)
    return job, created
