"""Receiving an upload: stream the multipart body into a fresh folder under
``data_dir/uploads/``, counting bytes as they arrive (413 as soon as ``max_upload_bytes``
is passed, and up front from ``Content-Length``), holding one of the upload slots.

The services never see a request: whatever serves HTTP hands over an ``IncomingBody``
(``app.api.uploads.incoming`` builds it). The folder is removed on any failure, and
claimed from the scratch sweeper until ``remove_folder``.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from python_multipart import MultipartParser
from python_multipart.exceptions import FormParserError
from python_multipart.multipart import parse_options_header

from autofusion.app.core.config import Settings
from autofusion.app.core.errors import ProblemError
from autofusion.app.services import scratch
from autofusion.app.services.uploads._form import (
    MODEL_FIELD,
    FormWriter,
    Upload,
    bad_upload,
    too_large,
)
from autofusion.app.services.uploads._slots import UploadSlots

__all__ = ["ClientGone", "IncomingBody", "receive_upload", "remove_folder"]


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
    # Whether the client has left (once its body has arrived): work done for it, such as
    # a pattern trial's sandbox, stops then.
    gone: Callable[[], Awaitable[bool]] | None = None
    # The client's address, where known: whose slots an anonymous upload takes.
    client: str | None = None


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
        raise too_large(
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
    data_uploads: bool = False,
) -> Upload:
    """Stream the multipart body into a new upload folder, enforcing the size limit,
    holding one of the process's upload slots (and one of ``tenant``'s) meanwhile.

    ``text_fields``: names of small text parts accepted besides model, data and config
    (kept in ``Upload.fields``); ``data_uploads``: 'data_upload' fields are taken too (kept
    in ``Upload.data_uploads``)."""
    limit = settings.max_upload_bytes
    boundary = _boundary(body.content_type)
    _check_declared_length(body.content_length, limit)
    owner = _slot_owner(tenant, body, settings)
    with body.slots.hold(owner):
        writer = partial(FormWriter, text_fields=text_fields, data_uploads=data_uploads)
        upload = await _stream_upload(body.chunks, settings, boundary, writer)
    upload.owner = owner
    return upload


def _slot_owner(tenant: str | None, body: IncomingBody, settings: Settings) -> str | None:
    """Whose upload slots an upload takes: its tenant's; on a server without keys, where
    every request is the default tenant, its client address's (four slow uploads from
    one client no longer hold everyone's slots)."""
    anonymous = not settings.require_api_keys and tenant == settings.default_tenant
    if anonymous and body.client is not None:
        return f"{tenant}@{body.client}"
    return tenant


async def _stream_upload(
    chunks: AsyncIterator[bytes],
    settings: Settings,
    boundary: bytes,
    make_writer: Callable[[Upload], FormWriter],
) -> Upload:
    limit = settings.max_upload_bytes
    upload = Upload(settings.uploads_dir / uuid.uuid4().hex)
    upload.folder.mkdir(parents=True)
    # Held until remove_folder: however long the check and the store take, the sweeper
    # of this process leaves it alone.
    scratch.claim(upload.folder)
    writer = make_writer(upload)
    try:
        parser = MultipartParser(boundary, writer.callbacks())
        received = 0
        async for chunk in chunks:
            received += len(chunk)
            if received > limit:
                raise too_large(
                    f"the request body passed {limit} bytes, this server's limit "
                    "(max_upload_bytes)",
                    limit,
                )
            if chunk:
                await asyncio.to_thread(parser.write, chunk)
        parser.finalize()
        if not writer.finished:
            raise bad_upload("the multipart body ended before its closing boundary")
        if upload.model_name is None:
            raise bad_upload("the form has no 'model' part: send the ONNX file", MODEL_FIELD)
    except FormParserError as exc:
        writer.close()
        remove_folder(upload.folder)
        raise bad_upload(f"the body is not valid multipart/form-data: {exc}") from exc
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
