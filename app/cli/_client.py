"""The client commands' (``submit``, ``jobs``, ``registry``) side of the typed client: its
HTTP (``autofusion.app.client``: retries, uploads, downloads, following a job) with each
error mapped to the exit codes of ``app.cli._exit``, and the --server/--api-key options.
The standard library and httpx only, as the base install has them."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from autofusion.app.cli._exit import (
    EXIT_SERVER,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    for_http_status,
)
from autofusion.app.client import (
    FINAL,
    AutofusionError,
    RequestRefused,
    Transport,
    UnexpectedResponse,
    Upload,
    WaitTimeout,
    download_model_files,
    model_data_links,
    poll,
    retry_after,
)
from autofusion.app.client import read_json as _read_json

__all__ = [
    "FINAL",
    "Client",
    "ClientError",
    "Upload",
    "add_server_options",
    "check_server",
    "client_from_args",
    "exit_codes",
    "follow",
    "read_json",
    "retry_after",
    "with_client",
]


class ClientError(Exception):
    """Stop with a message and an exit code; ``status`` is the HTTP status that said no."""

    def __init__(self, message: str, code: int, *, status: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.status = status


@contextmanager
def exit_codes() -> Iterator[None]:
    """The typed client's errors as ``ClientError``: the same message, the exit code that
    says what went wrong (the server's refusal by its status and problem type)."""
    try:
        yield
    except RequestRefused as exc:
        code = for_http_status(exc.status, exc.type)
        raise ClientError(str(exc), code, status=exc.status) from None
    except WaitTimeout as exc:
        raise ClientError(str(exc), EXIT_TIMEOUT) from None
    except UnexpectedResponse as exc:
        raise ClientError(
            f"the server answered {exc.where} with something other than a JSON object "
            f"({exc.content_type}): is --server right?",
            EXIT_SERVER,
        ) from None
    except AutofusionError as exc:  # unreachable, or a download that broke off
        raise ClientError(str(exc), EXIT_SERVER) from None


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


class Client:
    """The typed client's transport, its errors raised as ``ClientError``."""

    def __init__(self, server: str, api_key: str | None) -> None:
        self.transport = Transport(server, api_key, user_agent="autofusion-cli/1")
        self.server = self.transport.server

    @property
    def http(self) -> httpx.Client:
        return self.transport.http

    @http.setter
    def http(self, value: httpx.Client) -> None:  # a test's own transport
        self.transport.http = value

    def close(self) -> None:
        self.transport.close()

    def send(self, method: str, url: str, **kwargs: Any) -> httpx.Response:
        """Send, retrying connection errors and 502/503/504 with backoff."""
        with exit_codes():
            return self.transport.send(method, url, **kwargs)

    def upload(self, upload: Upload, key: str) -> httpx.Response:
        with exit_codes():
            return self.transport.upload(upload, key)

    def download(self, url: str, destination: Path) -> None:
        with exit_codes():
            self.transport.download(url, destination)

    def download_model(self, job: dict, model_url: str, destination: Path) -> list[Path]:
        """The fused model at ``destination`` and its data files beside it, under the
        names it gives them (the job's ``links.model_data``); the files written."""
        with exit_codes():
            links = model_data_links(job)
            return download_model_files(self.transport.download, model_url, links, destination)


def read_json(response: httpx.Response) -> dict:
    with exit_codes():
        return _read_json(response)


def follow(
    client: Client, job_url: str, job: dict, delay: float, timeout: float, progress: Any
) -> dict:
    """Poll the job until it is final, honouring Retry-After and sending If-None-Match."""
    with exit_codes():
        return poll(client.transport, job_url, job, delay, timeout, progress.update)
