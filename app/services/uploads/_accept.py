"""Accepting an upload: its options checked, the model inspected, its files stored; then
the job created, once, whatever retries the client sends with one Idempotency-Key.

``create_job_for_upload`` commits: it inserts or reads the job of an idempotency key, and a
concurrent request with the same key must see the row (tests/test_layout.py lists it).
"""

from __future__ import annotations

import asyncio
import json
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
    upload: Upload, store: ArtifactStore
) -> tuple[str, list[dict[str, str]], dict[str, int]]:
    """Put the model and data files in the store: ``(model digest, [{name, digest}],
    {digest: size})``."""
    paths = [upload.model_path, *(upload.folder / name for name in sorted(upload.data_names))]
    digests = [store.put_file(path) for path in paths]
    sizes = {digest: path.stat().st_size for digest, path in zip(digests, paths, strict=True)}
    data_files = [
        {"name": path.name, "digest": digest}
        for path, digest in zip(paths[1:], digests[1:], strict=True)
    ]
    return digests[0], data_files, sizes


async def accept_upload(
    body: IncomingBody, settings: Settings, store: ArtifactStore, *, tenant: str | None = None
) -> StoredUpload:
    """Receive, check and store an upload; the upload folder is gone afterwards."""
    upload = await receive_upload(body, settings, tenant=tenant)
    return await accept_received(upload, settings, store)


async def accept_received(upload: Upload, settings: Settings, store: ArtifactStore) -> StoredUpload:
    """Check and store what ``receive_upload`` wrote; the upload folder is gone afterwards."""
    try:
        options = parse_options(upload.config_text)
        check_callback_url(options.callback_url, settings, "config.callback_url")
        # In a sandbox with its own limits (model_work): the API process parses no model.
        await inspect_upload(upload.model_path, upload.data_names, settings, owner=upload.owner)
        model_digest, data_files, sizes = await asyncio.to_thread(store_upload, upload, store)
    finally:
        await asyncio.to_thread(remove_folder, upload.folder)
    return StoredUpload(upload.model_path.name, model_digest, data_files, options, sizes)


def create_job_for_upload(
    session: Session,
    principal: Principal,
    stored: StoredUpload,
    *,
    idempotency_key: str | None,
    max_attempts: int,
    quotas: Quotas | None = None,
    key_ttl_s: float | None = None,
) -> tuple[Job, bool]:
    """Create (and commit) the job, or find the one this Idempotency-Key made before
    (less than ``key_ttl_s`` ago). ``quotas``: the tenant's limits, checked with the
    insert (429 or 507, nothing kept)."""
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
            attach_callback(session, job, stored.options.callback_url)
        session.commit()
    except IntegrityError:
        if not idempotency_key:
            raise
        # A concurrent request with the same key inserted first: answer with its job.
        session.rollback()
        job, created = create_job(session, principal, **arguments)
    return job, created
