"""The HTTP of every client of the service (the typed ``Client`` and the CLI's ``submit``,
``jobs`` and ``registry``): requests with transient failures retried, errors raised as
``RequestRefused`` with the problem document's fields, a model uploaded so that a retry
resends it whole, downloads written whole or not at all. Data files too big for one body
go first through ``/v1/uploads`` (``_uploads.py``); the upload names them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx

from autofusion.app.client._errors import RequestRefused, UnexpectedResponse, Unreachable

__all__ = ["Transport", "Upload", "read_json", "retry_after"]

_TRANSIENT_STATUS = (502, 503, 504)
# (connect, read, write, pool) seconds: a tuple, which httpx takes and so does any client
# built like it (starlette's TestClient builds on httpx2 where huggingface_hub installed it,
# and rejects an httpx.Timeout)
_TIMEOUT = (10.0, 60.0, 60.0, 60.0)
_UPLOAD_TIMEOUT = (10.0, 600.0, None, 600.0)  # a large model may take long to send
_DOWNLOAD_TIMEOUT = (10.0, 600.0, 600.0, 600.0)


@dataclass
class Upload:
    """What ``POST /v1/optimize`` sends: the model, its external-data files, the config."""

    model: Path
    data: list[Path] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)

    @staticmethod
    def data_name(path: Path) -> str:
        """The name a data file has on the server: its plain file name, as the model's
        external-data locations name it."""
        return path.name


class Transport:
    """httpx with the service's error documents raised and transient failures retried."""

    def __init__(self, server: str, api_key: str | None, *, user_agent: str) -> None:
        headers = {"User-Agent": user_agent, "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.server = server.rstrip("/")
        self.http = httpx.Client(base_url=self.server, headers=headers, timeout=_TIMEOUT)
        # Data files this transport sent through /v1/uploads: (name, sha256) -> the
        # upload's id, so a second submit of the same file (another target) names it
        # again while the server keeps it, instead of sending it again.
        self.data_uploads: dict[tuple[str, str], str] = {}

    def close(self) -> None:
        self.http.close()

    def send(
        self, method: str, url: str, *, attempts: int = 5, body: Any = None, **kwargs: Any
    ) -> httpx.Response:
        """Send, retrying connection errors and 502/503/504 with backoff.

        ``body``, if given, is called before each attempt for fresh request content.
        """
        delay = 0.5
        for attempt in range(1, attempts + 1):
            try:
                response = self.http.request(method, url, **kwargs, **(body() if body else {}))
            except httpx.TransportError as exc:
                if attempt == attempts:
                    raise Unreachable(
                        f"cannot reach the server at {self.server}: {exc or type(exc).__name__}"
                    ) from None
            else:
                in_use = _key_in_use(response)
                if (response.status_code not in _TRANSIENT_STATUS and not in_use) or (
                    attempt == attempts
                ):
                    return _raise_for_problem(response)
                if in_use:  # an earlier try of ours is still being received: wait for it
                    time.sleep(retry_after(response, delay))
                    continue
            time.sleep(delay)
            delay = min(delay * 2, 8.0)
        raise AssertionError("unreachable")

    def upload(
        self, upload: Upload, key: str, *, data_uploads: Mapping[Path, str] | None = None
    ) -> httpx.Response:
        """``POST /v1/optimize`` with this ``Idempotency-Key``: safe to resend, a repeat
        with the same key returns the same job. ``data_uploads``: data files sent
        already, each named by its upload's id (a ``data_upload`` field) instead of sent
        as a ``data`` part."""
        opened: list[Any] = []
        try:
            return self.send(
                "POST",
                "/v1/optimize",
                attempts=3,
                body=_multipart(upload, opened, data_uploads or {}),
                headers={"Idempotency-Key": key},
                timeout=_UPLOAD_TIMEOUT,
            )
        finally:
            for f in opened:
                f.close()

    def download(self, url: str, destination: Path, *, attempts: int = 4) -> None:
        """Stream ``url`` to ``destination`` through a ``.part`` file: whole or not at all.
        A connection broken mid-body is resumed where it stopped (``Range`` from the bytes
        written, ``If-Range`` with the first answer's ETag, so a file that changed meanwhile
        comes whole again): a multi-GB data file is not fetched from its start again."""
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(destination.name + ".part")
        state = _Resume()
        try:
            for attempt in range(attempts):
                try:
                    self._download_from(url, partial, state)
                    os.replace(partial, destination)
                    return
                except httpx.TransportError as exc:
                    state.error = exc
                    if attempt + 1 < attempts:
                        time.sleep(min(2.0**attempt, 10.0))
            raise Unreachable(f"download of {url} failed: {state.error}") from None
        finally:
            partial.unlink(missing_ok=True)

    def _download_from(self, url: str, partial: Path, state: _Resume) -> None:
        """One GET of ``url`` into ``partial``, from ``state.received`` when the server
        answers the range (206), else from the start."""
        headers = state.range_headers()
        with self.http.stream("GET", url, headers=headers, timeout=_DOWNLOAD_TIMEOUT) as r:
            _raise_for_problem(r, streamed=True)
            state.answered(r)
            with open(partial, "r+b" if state.received else "wb") as f:
                f.seek(state.received)
                f.truncate()
                for chunk in r.iter_bytes():  # as they arrive: what came is kept if it breaks
                    f.write(chunk)
                    state.received += len(chunk)


@dataclass
class _Resume:
    """Where an interrupted download stands: the bytes written and the file's ETag."""

    received: int = 0
    etag: str | None = None
    error: Exception | None = None

    def range_headers(self) -> dict[str, str]:
        if not (self.received and self.etag):
            return {}
        return {"Range": f"bytes={self.received}-", "If-Range": self.etag}

    def answered(self, response: httpx.Response) -> None:
        """A 206 continues at ``received`` (its Content-Range says so); anything else is
        the whole file again."""
        start = response.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
        if response.status_code != 206 or start != str(self.received):
            self.received = 0
        self.etag = response.headers.get("ETag")


def _multipart(
    upload: Upload, opened: list[Any], data_uploads: Mapping[Path, str]
) -> Callable[[], dict]:
    def body() -> dict:
        # Reopened per attempt: a retry must send the files from their start.
        for f in opened:
            f.close()
        opened.clear()
        parts = [("model", (upload.model.name, open(upload.model, "rb")))]  # noqa: SIM115
        parts += [
            ("data", (upload.data_name(p), open(p, "rb")))  # noqa: SIM115
            for p in upload.data
            if p not in data_uploads
        ]
        opened.extend(part[1][1] for part in parts)
        fields: dict[str, Any] = {"config": json.dumps(upload.config)}
        if data_uploads:
            fields["data_upload"] = [data_uploads[p] for p in upload.data if p in data_uploads]
        return {"files": parts, "data": fields}

    return body


def _raise_for_problem(response: httpx.Response, *, streamed: bool = False) -> httpx.Response:
    if response.status_code < 400:
        return response
    if streamed:
        response.read()
    try:
        problem = response.json()
    except ValueError:
        problem = None
    text = response.text.strip()[:500] or response.reason_phrase
    raise RequestRefused(
        response.request.method,
        response.request.url.path,
        response.status_code,
        problem if isinstance(problem, dict) else None,
        text,
    )


def read_json(response: httpx.Response) -> dict:
    """The answer's JSON object, or ``UnexpectedResponse``."""
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise UnexpectedResponse(
            f"{response.request.method} {response.request.url.path}",
            response.headers.get("content-type", "no content type"),
        )
    return data


def _key_in_use(response: httpx.Response) -> bool:
    """A 409 for an Idempotency-Key whose first request the server is still receiving
    (a try of ours that timed out here but not there): retried after its Retry-After."""
    if response.status_code != 409:
        return False
    try:
        kind = response.json().get("type", "")
    except (ValueError, AttributeError):
        return False
    return str(kind).endswith("/idempotency-key-in-use")


def retry_after(response: httpx.Response, default: float) -> float:
    """The answer's Retry-After in seconds (a number or a date), within 0.1 to 60."""
    value = response.headers.get("Retry-After")
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return default
    return min(max(seconds, 0.1), 60.0)
