"""Receiving ``POST /v1/optimize``: stream, check, store, then create the job.

1. ``receive_upload`` streams the multipart body into a fresh folder under
   ``data_dir/uploads/`` with python-multipart's streaming parser, counting bytes as
   they arrive (413 as soon as ``max_upload_bytes`` is passed, and up front from
   ``Content-Length``). File parts go straight to disk; the only part held in memory is
   ``config``, bounded to ``MAX_CONFIG_BYTES``.
2. ``parse_options`` validates ``config`` against ``OptimizeOptions``.
3. ``inspect_model`` (``model_checks``) parses the ModelProto alone and refuses what a
   hostile model could abuse, before anything in ``fusion_core`` loads it; a model over
   ``api_inline_check_bytes`` is parsed in a child process (``model_sandbox``).
4. ``store_upload`` puts the model and data files in the artifact store.

The upload folder is removed whatever happens; ``accept_upload`` runs steps 1-4.

No step holds a database session: the route creates the job (``create_job_for_upload``)
with a session of its own once the upload is stored, for one short write. While it
streams, an upload holds one of ``UploadSlots``: at most ``max_concurrent_uploads`` per
process and ``max_concurrent_uploads_per_tenant`` per tenant, 429 with Retry-After
beyond. Size and time limits on the body itself are ``app/api/limits.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
import threading
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError
from python_multipart import MultipartParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.job_records import OptimizeOptions
from autofusion.app.core.models import Job, Strategy
from autofusion.app.services import scratch
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.auth import Principal
from autofusion.app.services.jobs import check_pattern_names, create_job
from autofusion.app.services.model_sandbox import inspect_upload
from autofusion.fusion_core.errors import describe_fields, field_errors

__all__ = [
    "MAX_CONFIG_BYTES",
    "MAX_DATA_FILES",
    "ClientGone",
    "IncomingBody",
    "StoredUpload",
    "Upload",
    "UploadSlots",
    "accept_received",
    "accept_upload",
    "check_file_name",
    "create_job_for_upload",
    "parse_options",
    "receive_upload",
    "store_upload",
]

logger = logging.getLogger(__name__)

MODEL_FIELD, DATA_FIELD, CONFIG_FIELD = "model", "data", "config"
DEFAULT_MODEL_NAME = "model.onnx"
MAX_CONFIG_BYTES = 1 << 20
MAX_DATA_FILES = 1000
MAX_NAME_LENGTH = 255


@dataclass
class Upload:
    """What ``receive_upload`` wrote: the model and data files, by name, in ``folder``."""

    folder: Path
    model_name: str | None = None
    data_names: list[str] = field(default_factory=list)
    config_text: str | None = None
    # Small text parts a caller asked for by name (the dashboard's form fields).
    fields: dict[str, str] = field(default_factory=dict)

    @property
    def model_path(self) -> Path:
        return self.folder / (self.model_name or DEFAULT_MODEL_NAME)


@dataclass(frozen=True)
class StoredUpload:
    """An accepted upload: its blobs are in the artifact store, its folder is gone."""

    model_name: str
    model_digest: str
    data_files: list[dict[str, str]]
    options: OptimizeOptions


class ClientGone(Exception):
    """The client went away before its body had arrived (the API layer raises it)."""


@dataclass
class IncomingBody:
    """A request body as the upload code needs it, from whatever serves HTTP
    (``app.api.uploads.incoming`` builds it from a request): the two headers, the chunks
    as they arrive (raising ``ClientGone`` if the client leaves) and the slots."""

    content_type: str | None
    content_length: str | None
    chunks: AsyncIterator[bytes]
    slots: UploadSlots


class UploadSlots:
    """How many uploads stream at once in this process, in all and per tenant."""

    def __init__(self, total: int, per_tenant: int, retry_after_s: int) -> None:
        self.total, self.per_tenant, self.retry_after_s = total, per_tenant, retry_after_s
        self._lock = threading.Lock()
        self._active = 0
        self._by_tenant: Counter[str] = Counter()

    @classmethod
    def from_settings(cls, settings: Settings) -> UploadSlots:
        return cls(
            settings.max_concurrent_uploads,
            settings.max_concurrent_uploads_per_tenant,
            settings.retry_after_s,
        )

    @property
    def active(self) -> int:
        return self._active

    @contextmanager
    def hold(self, tenant: str | None) -> Iterator[None]:
        """One slot for the block; 429 at once when none is free."""
        with self._lock:
            if self._active >= self.total:
                raise self._busy(
                    f"{self._active} uploads are in progress, this server's limit "
                    "(max_concurrent_uploads)"
                )
            if tenant is not None and self._by_tenant[tenant] >= self.per_tenant:
                raise self._busy(
                    f"this tenant has {self.per_tenant} uploads in progress, the limit per "
                    "tenant (max_concurrent_uploads_per_tenant)"
                )
            self._active += 1
            if tenant is not None:
                self._by_tenant[tenant] += 1
        try:
            yield
        finally:
            with self._lock:
                self._active -= 1
                if tenant is not None:
                    self._by_tenant[tenant] -= 1
                    if self._by_tenant[tenant] <= 0:
                        del self._by_tenant[tenant]

    def _busy(self, detail: str) -> ProblemError:
        error = ProblemError(
            429,
            "too-many-uploads",
            "Too many uploads",
            f"{detail}; retry in {self.retry_after_s} s",
        )
        error.headers = {"Retry-After": str(self.retry_after_s)}
        return error


def _bad_upload(detail: str, field_name: str | None = None) -> ProblemError:
    extra = {"field": field_name} if field_name else {}
    return ProblemError(422, "invalid-upload", "Invalid upload", detail, **extra)


def _too_large(detail: str, limit: int) -> ProblemError:
    return ProblemError(413, "payload-too-large", "Payload too large", detail, limit=limit)


def check_file_name(name: str, field_name: str) -> str:
    """A plain file name: no path separators, not ``.``/``..``, no control characters."""
    if (
        not name
        or name in (".", "..")
        or len(name) > MAX_NAME_LENGTH
        or any(c in name for c in "/\\:")
        or any(ord(c) < 32 for c in name)
    ):
        raise _bad_upload(
            f"the file name {name!r} of a {field_name!r} part is not a plain file name "
            "(no '/', '\\', ':', '..' or control characters, at most 255 characters)",
            field_name,
        )
    return name


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


class _FormWriter:
    """python-multipart callbacks: file parts go to disk as they arrive, ``config`` to a
    bounded buffer; anything unexpected stops the upload with a problem."""

    def __init__(self, upload: Upload, text_fields: frozenset[str] = frozenset()) -> None:
        self.upload = upload
        self.text_fields = text_fields
        self._text: bytearray | None = None
        self.finished = False
        self._header_name = bytearray()
        self._header_value = bytearray()
        self._disposition = b""
        self._field: str | None = None
        self._file: BinaryIO | None = None
        self._config: bytearray | None = None
        self._names: set[str] = set()

    def callbacks(self) -> dict:
        return {
            name: getattr(self, name)
            for name in (
                "on_part_begin",
                "on_part_data",
                "on_part_end",
                "on_header_field",
                "on_header_value",
                "on_header_end",
                "on_headers_finished",
                "on_end",
            )
        }

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def on_part_begin(self) -> None:
        self._disposition, self._field = b"", None

    def on_header_field(self, data: bytes, start: int, end: int) -> None:
        self._header_name += data[start:end]

    def on_header_value(self, data: bytes, start: int, end: int) -> None:
        self._header_value += data[start:end]

    def on_header_end(self) -> None:
        if bytes(self._header_name).strip().lower() == b"content-disposition":
            self._disposition = bytes(self._header_value)
        self._header_name, self._header_value = bytearray(), bytearray()

    def on_headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        if b"name" not in options:
            raise _bad_upload("every part needs a Content-Disposition header with a name")
        self._field = _decode(options[b"name"])
        filename = _decode(options[b"filename"]) if b"filename" in options else None
        if self._field == MODEL_FIELD:
            if self.upload.model_name is not None:
                raise _bad_upload("send exactly one 'model' part", MODEL_FIELD)
            self.upload.model_name = self._open(filename or DEFAULT_MODEL_NAME, MODEL_FIELD)
        elif self._field == DATA_FIELD:
            if filename is None:
                raise _bad_upload(
                    "each 'data' part needs a filename: the name external-data locations use",
                    DATA_FIELD,
                )
            if len(self.upload.data_names) >= MAX_DATA_FILES:
                raise _bad_upload(f"at most {MAX_DATA_FILES} 'data' parts", DATA_FIELD)
            self.upload.data_names.append(self._open(filename, DATA_FIELD))
        elif self._field == CONFIG_FIELD:
            if self._config is not None:
                raise _bad_upload("send at most one 'config' part", CONFIG_FIELD)
            self._config = bytearray()
        elif self._field in self.text_fields and filename is None:
            if self._field in self.upload.fields:
                raise _bad_upload(f"send at most one {self._field!r} part", self._field)
            self._text = bytearray()
        else:
            raise _bad_upload(
                f"unknown form field {self._field!r}; expected 'model', 'data' or 'config'",
                self._field,
            )

    def _open(self, name: str, field_name: str) -> str:
        check_file_name(name, field_name)
        if name in self._names:
            raise _bad_upload(f"two parts are named {name!r}; file names must differ", field_name)
        self._names.add(name)
        # "xb": a fresh folder holds only what we write, never a link planted beforehand.
        self._file = open(self.upload.folder / name, "xb")  # noqa: SIM115 (closed in on_part_end)
        return name

    def on_part_data(self, data: bytes, start: int, end: int) -> None:
        if self._file is not None:
            self._file.write(data[start:end])
        elif self._text is not None:
            if len(self._text) + (end - start) > MAX_CONFIG_BYTES:
                raise _too_large(
                    f"the {self._field!r} part exceeds {MAX_CONFIG_BYTES} bytes", MAX_CONFIG_BYTES
                )
            self._text += data[start:end]
        elif self._config is not None and self._field == CONFIG_FIELD:
            if len(self._config) + (end - start) > MAX_CONFIG_BYTES:
                raise _too_large(
                    f"the 'config' part exceeds {MAX_CONFIG_BYTES} bytes", MAX_CONFIG_BYTES
                )
            self._config += data[start:end]

    def on_part_end(self) -> None:
        if self._file is not None:
            self.close()
        elif self._text is not None:
            self.upload.fields[self._field] = _decode(bytes(self._text))
            self._text = None
        elif self._field == CONFIG_FIELD and self._config is not None:
            try:
                self.upload.config_text = bytes(self._config).decode("utf-8")
            except UnicodeDecodeError:
                raise _invalid_config("config", "the config is not UTF-8 text") from None

    def on_end(self) -> None:
        self.finished = True


def _boundary(content_type: str | None) -> bytes:
    media_type, params = parse_options_header(content_type or "")
    if media_type != b"multipart/form-data" or not params.get(b"boundary"):
        raise ProblemError(
            415,
            "unsupported-media-type",
            "Unsupported media type",
            "send the model as multipart/form-data with a 'model' file part "
            "(e.g. curl -F model=@model.onnx)",
        )
    return params[b"boundary"]


def _check_declared_length(content_length: str | None, limit: int) -> None:
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise _too_large(
            f"the request body is {content_length} bytes; this server accepts at most "
            f"{limit} bytes (max_upload_bytes)",
            limit,
        )


def remove_folder(folder: Path) -> None:
    """Remove an upload folder and let go of it (``scratch.claim`` in ``_stream_upload``)."""
    shutil.rmtree(folder, ignore_errors=True)
    scratch.release(folder)


async def receive_upload(
    body: IncomingBody,
    settings: Settings,
    *,
    text_fields: frozenset[str] = frozenset(),
    tenant: str | None = None,
) -> Upload:
    """Stream the multipart body into a new upload folder, enforcing the size limit,
    holding one of the process's upload slots (and one of ``tenant``'s) meanwhile.

    ``text_fields``: names of small text parts accepted besides model, data and config
    (kept in ``Upload.fields``)."""
    limit = settings.max_upload_bytes
    boundary = _boundary(body.content_type)
    _check_declared_length(body.content_length, limit)
    with body.slots.hold(tenant):
        return await _stream_upload(body.chunks, settings, boundary, text_fields)


async def _stream_upload(
    chunks: AsyncIterator[bytes], settings: Settings, boundary: bytes, text_fields: frozenset[str]
) -> Upload:
    limit = settings.max_upload_bytes
    upload = Upload(settings.uploads_dir / uuid.uuid4().hex)
    upload.folder.mkdir(parents=True)
    # Held until remove_folder: however long the check and the store take, the sweeper
    # of this process leaves it alone.
    scratch.claim(upload.folder)
    writer = _FormWriter(upload, text_fields)
    try:
        parser = MultipartParser(boundary, writer.callbacks())
        received = 0
        async for chunk in chunks:
            received += len(chunk)
            if received > limit:
                raise _too_large(
                    f"the request body passed {limit} bytes, this server's limit "
                    "(max_upload_bytes)",
                    limit,
                )
            if chunk:
                await asyncio.to_thread(parser.write, chunk)
        parser.finalize()
        if not writer.finished:
            raise _bad_upload("the multipart body ended before its closing boundary")
        if upload.model_name is None:
            raise _bad_upload("the form has no 'model' part: send the ONNX file", MODEL_FIELD)
    except FormParserError as exc:
        writer.close()
        remove_folder(upload.folder)
        raise _bad_upload(f"the body is not valid multipart/form-data: {exc}") from exc
    except ClientGone:
        writer.close()
        remove_folder(upload.folder)
        raise ProblemError(
            400, "upload-incomplete", "Upload incomplete", "the client disconnected"
        ) from None
    except BaseException:
        writer.close()
        remove_folder(upload.folder)
        raise
    return upload


def _invalid_config(field_name: str, message: str) -> ProblemError:
    return ProblemError(
        422,
        "invalid-config",
        "Invalid config",
        f"{field_name}: {message}",
        errors=[{"field": field_name, "message": message}],
    )


def parse_options(text: str | None) -> OptimizeOptions:
    """The ``config`` form field as ``OptimizeOptions``; errors name the field."""
    if text is None or not text.strip():
        return OptimizeOptions()
    try:
        raw = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise _invalid_config("config", f"not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise _invalid_config("config", "must be a JSON object")
    try:
        return OptimizeOptions.model_validate(raw)
    except ValidationError as exc:
        pairs = field_errors(exc, prefix=("config",))
        errors = [{"field": f, "message": m} for f, m in pairs]
        detail = describe_fields(pairs)
        raise ProblemError(422, "invalid-config", "Invalid config", detail, errors=errors) from None


def store_upload(upload: Upload, store: ArtifactStore) -> tuple[str, list[dict[str, str]]]:
    """Put the model and data files in the store: ``(model digest, [{name, digest}])``."""
    model_digest = store.put_file(upload.model_path)
    data_files = [
        {"name": name, "digest": store.put_file(upload.folder / name)}
        for name in sorted(upload.data_names)
    ]
    return model_digest, data_files


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
        # Past api_inline_check_bytes, in a child with a memory limit (model_sandbox).
        await inspect_upload(upload.model_path, upload.data_names, settings)
        model_digest, data_files = await asyncio.to_thread(store_upload, upload, store)
    finally:
        await asyncio.to_thread(remove_folder, upload.folder)
    return StoredUpload(upload.model_path.name, model_digest, data_files, options)


def create_job_for_upload(
    session: Session,
    principal: Principal,
    stored: StoredUpload,
    *,
    idempotency_key: str | None,
    max_attempts: int,
) -> tuple[Job, bool]:
    """Create (and commit) the job, or find the one this Idempotency-Key made before."""
    strategy = stored.options.strategy
    if strategy is not None and session.get(Strategy, strategy) is None:
        raise _invalid_config("config.strategy", f"there is no strategy named {strategy!r}")
    config = stored.options.model_dump(mode="json", exclude_unset=True, exclude={"strategy"})
    check_pattern_names(session, config)  # a 422 now, not a job that fails in the worker
    arguments = {
        "model_name": stored.model_name,
        "model_digest": stored.model_digest,
        "data_files": stored.data_files,
        "config": config,
        "strategy": strategy,
        "idempotency_key": idempotency_key,
        "max_attempts": max_attempts,
    }
    try:
        job, created = create_job(session, principal, **arguments)
        session.commit()
    except IntegrityError:
        if not idempotency_key:
            raise
        # A concurrent request with the same key inserted first: answer with its job.
        session.rollback()
        job, created = create_job(session, principal, **arguments)
    return job, created
