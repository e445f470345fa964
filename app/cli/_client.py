"""The HTTP client of the CLI's client commands (``submit``, ``jobs``, ``registry``):
requests with errors mapped to the exit codes of ``app.cli._exit``, transient failures
retried, a model uploaded (``Upload``: model, data files, config) so that a retry
resends it whole, downloads written whole or not at all, and a job followed to its
end."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import Any

import httpx

from autofusion.app.cli._exit import EXIT_SERVER, EXIT_TIMEOUT, EXIT_USAGE, for_http_status

__all__ = [
    "FINAL",
    "Client",
    "ClientError",
    "Upload",
    "add_server_options",
    "check_server",
    "client_from_args",
    "follow",
    "read_json",
    "with_client",
    "retry_after",
]

FINAL = ("succeeded", "failed", "cancelled")
_TRANSIENT_STATUS = (502, 503, 504)
_CHUNK = 1 << 20


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


class ClientError(Exception):
    """Stop with a message and an exit code; ``status`` is the HTTP status that said no."""

    def __init__(self, message: str, code: int, *, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


def add_server_options(p: argparse.ArgumentParser) -> None:
    """--server and --api-key, from the environment by default (submit, jobs, registry)."""
    p.add_argument(
        "--server",
        default=os.environ.get("AUTOFUSION_SERVER"),
        help="server URL, e.g. http://127.0.0.1:8000 (default: AUTOFUSION_SERVER)",
    )
    p.add_argument(
        "--api-key", default=os.environ.get("AUTOFUSION_API_KEY"),
        help="API key (default: AUTOFUSION_API_KEY; prefer the variable, it stays out of logs)",
    )  # fmt: skip


def check_server(server: str | None) -> str:
    if not server:
        raise ClientError("--server is required (or set AUTOFUSION_SERVER)", EXIT_USAGE)
    if not server.startswith(("http://", "https://")):
        raise ClientError(f"--server must be an http(s) URL, not {server!r}", EXIT_USAGE)
    return server


def client_from_args(args: argparse.Namespace) -> Client:
    return Client(check_server(args.server), args.api_key)


def with_client(args: argparse.Namespace, command: str, work: Callable[[Client], int]) -> int:
    """``work(client)`` with a client for --server/--api-key, closed after; a refusal is
    one line on stderr and its exit code."""
    try:
        client = client_from_args(args)
        try:
            return work(client)
        finally:
            client.close()
    except ClientError as exc:
        sys.stderr.write(f"autofusion {command}: {exc}\n")
        return exc.code


# (connect, read, write, pool) seconds: a tuple, which httpx takes and so does any client
# built like it (starlette's TestClient builds on httpx2 where huggingface_hub installed it,
# and rejects an httpx.Timeout)
_TIMEOUT = (10.0, 60.0, 60.0, 60.0)
_UPLOAD_TIMEOUT = (10.0, 600.0, None, 600.0)  # a large model may take long to send
_DOWNLOAD_TIMEOUT = (10.0, 600.0, 600.0, 600.0)


class Client:
    """httpx with the errors mapped to exit codes and transient failures retried."""

    def __init__(self, server: str, api_key: str | None) -> None:
        headers = {"User-Agent": "autofusion-cli/1", "Accept": "application/json"}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        self.server = server.rstrip("/")
        self.http = httpx.Client(base_url=self.server, headers=headers, timeout=_TIMEOUT)

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
                    raise ClientError(
                        f"cannot reach the server at {self.server}: {exc or type(exc).__name__}",
                        EXIT_SERVER,
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

    def upload(self, upload: Upload, key: str) -> httpx.Response:
        files_opened: list[Any] = []

        def body() -> dict:
            # Reopened per attempt: a retry must send the files from their start.
            for f in files_opened:
                f.close()
            files_opened.clear()
            parts = [("model", (upload.model.name, open(upload.model, "rb")))]  # noqa: SIM115
            parts += [
                ("data", (upload.data_name(p), open(p, "rb")))  # noqa: SIM115
                for p in upload.data
            ]
            files_opened.extend(part[1][1] for part in parts)
            return {"files": parts, "data": {"config": json.dumps(upload.config)}}

        try:
            # Safe to resend: with the same Idempotency-Key a repeat returns the same job.
            return self.send(
                "POST",
                "/v1/optimize",
                attempts=3,
                body=body,
                headers={"Idempotency-Key": key},
                timeout=_UPLOAD_TIMEOUT,
            )
        finally:
            for f in files_opened:
                f.close()

    def download(self, url: str, destination: Path) -> None:
        destination.parent.mkdir(parents=True, exist_ok=True)
        partial = destination.with_name(destination.name + ".part")
        try:
            with self.http.stream("GET", url, timeout=_DOWNLOAD_TIMEOUT) as r:
                _raise_for_problem(r, streamed=True)
                with open(partial, "wb") as f:
                    for chunk in r.iter_bytes(_CHUNK):
                        f.write(chunk)
            os.replace(partial, destination)
        except httpx.TransportError as exc:
            partial.unlink(missing_ok=True)
            raise ClientError(f"download of {url} failed: {exc}", EXIT_SERVER) from None


def _raise_for_problem(response: httpx.Response, *, streamed: bool = False) -> httpx.Response:
    if response.status_code < 400:
        return response
    if streamed:
        response.read()
    problem_type = ""
    try:
        problem = response.json()
        if not isinstance(problem, dict):
            raise ValueError("not a problem document")
        message = f"{problem.get('title', 'error')}: {problem.get('detail', '')}".rstrip(": ")
        problem_type = str(problem.get("type") or "")
    except ValueError:
        message = response.text.strip()[:500] or response.reason_phrase
    where = f"{response.request.method} {response.request.url.path}"
    status = response.status_code
    raise ClientError(
        f"the server refused {where} ({status}): {message}",
        for_http_status(status, problem_type),
        status=status,
    )


def read_json(response: httpx.Response) -> dict:
    try:
        data = response.json()
    except ValueError:
        data = None
    if not isinstance(data, dict):
        where = f"{response.request.method} {response.request.url.path}"
        raise ClientError(
            f"the server answered {where} with something other than a JSON object "
            f"({response.headers.get('content-type', 'no content type')}): is --server right?",
            EXIT_SERVER,
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


def follow(
    client: Client, job_url: str, job: dict, delay: float, timeout: float, progress: Any
) -> dict:
    """Poll the job until it is final, honouring Retry-After and sending If-None-Match."""
    deadline = time.monotonic() + timeout
    etag: str | None = None
    progress.update(job)
    while job["status"] not in FINAL:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ClientError(
                f"job {job['id']} is still {job['status']} after {timeout:g} s; "
                f"follow it at {client.server}{job_url}",
                EXIT_TIMEOUT,
            )
        time.sleep(min(delay, left))
        headers = {"If-None-Match": etag} if etag else {}
        response = client.send("GET", job_url, headers=headers)
        if response.status_code != 304:
            job = read_json(response)
            etag = response.headers.get("ETag")
        delay = retry_after(response, delay)
        progress.update(job)
    return job
