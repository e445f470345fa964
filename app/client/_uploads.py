"""Big data files through ``/v1/uploads``, before the job's upload names them.

A data file over ``chunked_upload_bytes`` is not put in the multipart body (the server
takes at most ``max_upload_bytes`` there, 2 GiB by default, and a body broken at 90% is
lost whole). It goes as a data upload: ``POST /v1/uploads`` (name, size, sha256), then
``PATCH``es of ``chunk_bytes`` each, streamed from the file. After a connection error
or a 5xx the sender asks ``HEAD`` where the server stands (it keeps what arrived, even
of a chunk cut short) and goes on from there, a few times with backoff, then gives up
with a clear error. ``POST /v1/optimize`` then names the upload with a ``data_upload``
field. A server without ``/v1/uploads`` (404) gets every file in the multipart body, as
before. The standard library and httpx only (the base install).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

from autofusion.app.client._errors import AutofusionError, RequestRefused, Unreachable
from autofusion.app.client._http import Transport, Upload, read_json
from autofusion.app.client._http import _raise_for_problem as raise_for_problem

__all__ = [
    "CHUNKED_UPLOAD_BYTES",
    "CHUNK_BYTES",
    "UploadProgress",
    "file_sha256",
    "send_data_files",
    "submit_upload",
]

CHUNKED_UPLOAD_BYTES = 64 * 1024**2  # data files larger than this go through /v1/uploads
CHUNK_BYTES = 64 * 1024**2  # the bytes of one PATCH
OFFSET_MEDIA_TYPE = "application/offset+octet-stream"
RETRIES = 5  # tries in a row without progress before the upload gives up
BACKOFF_S = 0.5  # the first wait before a retry; each next one doubles, up to 8 s
_READ = 1 << 20
# The last chunk's answer comes once the server has checked and stored the whole file
# (tens of GB read back and hashed): a long read timeout.
_CHUNK_TIMEOUT = (10.0, 3600.0, 600.0, 600.0)
_NOT_THERE = (404, 405)  # a server older than /v1/uploads
_NOT_TRANSIENT = (501, 505, 507)

# (file name, bytes the server has, file size): called as the bytes go.
UploadProgress = Callable[[str, int, int], None]

_digests: dict[tuple[str, int, int], str] = {}


def file_sha256(path: Path) -> str:
    """The file's sha256 (hex), read once per process while the file is unchanged (its
    size and mtime): submit's Idempotency-Key and the upload's declared digest share it."""
    stat = os.stat(path)
    key = (str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(_READ):
                digest.update(chunk)
        _digests[key] = digest.hexdigest()
    return _digests[key]


class _NoRoute(Exception):
    """The server has no ``/v1/uploads``."""


class _Broken(Exception):
    """A PATCH that did not get an answer to act on: resume from HEAD's offset."""


@dataclass
class _Sender:
    transport: Transport
    chunk_bytes: int
    on_progress: UploadProgress | None

    def send(self, path: Path, name: str) -> str:
        """The id of a complete upload of ``path``; ``_NoRoute`` on a server without it."""
        size, digest = path.stat().st_size, file_sha256(path)
        known = self.transport.data_uploads.get((name, digest))
        if known is not None and self._complete(known):
            self._progress(name, size, size)
            return known
        created = self._create(name, size, digest)
        if created.get("status") == "complete":  # sent before, from here or elsewhere
            self._progress(name, size, size)
            upload_id = str(created["id"])
        else:  # new, or the same file begun before: from where the server's bytes stand
            url, start = f"/v1/uploads/{created['id']}", int(created.get("received") or 0)
            upload_id = self._resume(url, path, name, size, start)
        self.transport.data_uploads[(name, digest)] = upload_id
        return upload_id

    def _create(self, name: str, size: int, digest: str) -> dict:
        body = {"name": name, "size": size, "sha256": digest}
        try:
            return read_json(self.transport.send("POST", "/v1/uploads", attempts=3, json=body))
        except RequestRefused as exc:
            if exc.status in _NOT_THERE:
                raise _NoRoute from None
            raise

    def _complete(self, upload_id: str) -> bool:
        """Whether the server still has that upload, complete (a file sent before)."""
        try:
            resource = read_json(self.transport.send("GET", f"/v1/uploads/{upload_id}"))
        except RequestRefused:
            return False
        return resource.get("status") == "complete"

    def _resume(self, url: str, path: Path, name: str, size: int, start: int = 0) -> str:
        """PATCH the file from the server's offset (``start``) on until it is complete."""
        offset, tries = start, 0
        while True:
            try:
                new_offset, resource = self._patch(url, path, name, offset, size)
            except _Broken as exc:
                tries += 1
                if tries >= RETRIES:
                    raise Unreachable(
                        f"the upload of {path} ({size} bytes) broke off at byte {offset} "
                        f"{tries} times in a row ({exc}); the server keeps what it has until "
                        f"it expires: check the connection and submit again"
                    ) from None
                time.sleep(min(BACKOFF_S * 2 ** (tries - 1), 8.0))
                offset = self._offset(url, offset)
                self._progress(name, offset, size)
                continue
            if resource is not None and resource.get("status") == "complete":
                return str(resource["id"])
            tries = 0 if new_offset > offset else tries + 1
            if tries >= RETRIES:
                raise Unreachable(f"the upload of {path} makes no progress at byte {offset}")
            offset = new_offset

    def _patch(
        self, url: str, path: Path, name: str, offset: int, size: int
    ) -> tuple[int, dict | None]:
        length = min(self.chunk_bytes, size - offset)
        headers = {
            "Upload-Offset": str(offset),
            "Content-Type": OFFSET_MEDIA_TYPE,
            "Content-Length": str(length),
        }
        content = self._read(path, name, offset, length, size)
        try:
            response = self.transport.http.request(
                "PATCH", url, content=content, headers=headers, timeout=_CHUNK_TIMEOUT
            )
        except httpx.TransportError as exc:
            raise _Broken(str(exc) or type(exc).__name__) from None
        except OSError as exc:  # the file, as it was read
            raise AutofusionError(f"cannot send {path}: {exc}") from None
        status = response.status_code
        if 500 <= status < 600 and status not in _NOT_TRANSIENT:
            raise _Broken(f"the server answered {status}")
        if status == 409 and "Upload-Offset" in response.headers:  # it has more, or less
            return int(response.headers["Upload-Offset"]), None
        raise_for_problem(response)
        new_offset = int(response.headers.get("Upload-Offset", offset + length))
        return new_offset, read_json(response) if status == 200 else None

    def _read(self, path: Path, name: str, offset: int, length: int, size: int) -> Iterator[bytes]:
        """The chunk, streamed from the file (never held whole), progress as it goes."""
        with open(path, "rb") as f:
            f.seek(offset)
            sent = 0
            while sent < length:
                chunk = f.read(min(_READ, length - sent))
                if not chunk:
                    raise OSError(f"{path} is shorter than it was: did it change?")
                sent += len(chunk)
                yield chunk
                self._progress(name, offset + sent, size)

    def _offset(self, url: str, offset: int) -> int:
        """The server's offset (HEAD); ``offset`` when it cannot say now."""
        try:
            response = self.transport.http.request("HEAD", url)
        except httpx.TransportError:
            return offset
        if response.status_code >= 500:
            return offset
        raise_for_problem(response)  # 404: it expired or was deleted
        return int(response.headers.get("Upload-Offset", offset))

    def _progress(self, name: str, sent: int, size: int) -> None:
        if self.on_progress is not None:
            self.on_progress(name, sent, size)


def send_data_files(
    transport: Transport,
    files: Iterable[Path],
    *,
    chunked_upload_bytes: int | None = None,
    chunk_bytes: int | None = None,
    on_progress: UploadProgress | None = None,
) -> dict[Path, str]:
    """Send the files over ``chunked_upload_bytes`` (default ``CHUNKED_UPLOAD_BYTES``) as
    data uploads, ``chunk_bytes`` (``CHUNK_BYTES``) a PATCH: their upload ids. Empty
    when the server has no ``/v1/uploads`` (they go in the multipart body)."""
    threshold = CHUNKED_UPLOAD_BYTES if chunked_upload_bytes is None else chunked_upload_bytes
    chunk_bytes = CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be 1 or more, not {chunk_bytes}")
    sender = _Sender(transport, chunk_bytes, on_progress)
    sent: dict[Path, str] = {}
    for path in files:
        if path.stat().st_size <= threshold:
            continue
        try:
            sent[path] = sender.send(path, Upload.data_name(path))
        except _NoRoute:
            return {}
    return sent


def submit_upload(
    transport: Transport,
    upload: Upload,
    key: str,
    *,
    chunked_upload_bytes: int | None = None,
    chunk_bytes: int | None = None,
    on_progress: UploadProgress | None = None,
) -> httpx.Response:
    """``POST /v1/optimize`` for ``upload``, its big data files sent first as data
    uploads (``send_data_files``) and named there."""
    staged = send_data_files(
        transport,
        upload.data,
        chunked_upload_bytes=chunked_upload_bytes,
        chunk_bytes=chunk_bytes,
        on_progress=on_progress,
    )
    return transport.upload(upload, key, data_uploads=staged)
