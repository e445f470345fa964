"""Honest reuse for ``autofusion submit``: the Idempotency-Key covers what a job's result
depends on, and a reused job is said to be one.

The key is the sha256 of the model, its data files and the config, and, as the server
reports them before the upload (``GET /v1/info``, one small read), the server's version,
its pattern registry snapshot and the version of the strategy the config names. So a
retried CI step gets the job its first try made, and a submit after a pattern was
disabled, a strategy changed or the server upgraded makes a new job instead of handing
back a result those changes would not give. A server without ``/v1/info`` (older than
it) gets the key of the inputs alone, as before. The key is the same whichever way the
files then travel (in the body, or a big data file through ``/v1/uploads``): the server
knows a data file by its bytes, and the file is read once for both (``file_sha256``).
The standard library and the client's HTTP only: the base install (no pydantic, no
engine) runs this.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from autofusion.app.cli._client import Client, ClientError, Upload, read_json
from autofusion.app.client import file_sha256

__all__ = ["ServerFacts", "idempotency_key", "reuse_note", "server_facts"]


@dataclass(frozen=True)
class ServerFacts:
    """What a job submitted now would run with, as the server says (None: not known)."""

    version: str | None = None
    registry_version: int | None = None
    strategy: str | None = None  # the named strategy of the config, if any
    strategy_version: int | None = None

    @property
    def known(self) -> bool:
        return self.registry_version is not None


def server_facts(client: Client, strategy: str | None) -> ServerFacts:
    """``GET /v1/info``; an empty ``ServerFacts`` from a server that has no such route."""
    try:
        info = read_json(client.send("GET", "/v1/info"))
    except ClientError as exc:
        if exc.status == 404:  # a server older than /v1/info
            return ServerFacts(strategy=strategy)
        raise
    strategies = info.get("strategies") if isinstance(info.get("strategies"), dict) else {}
    registry = info.get("registry_version")
    version = strategies.get(strategy) if strategy else None
    return ServerFacts(
        version=str(info.get("version") or "unknown"),
        registry_version=registry if isinstance(registry, int) else None,
        strategy=strategy,
        strategy_version=version if isinstance(version, int) else None,
    )


def idempotency_key(upload: Upload, facts: ServerFacts | None = None) -> str:
    """Stable for the same model, data (names and bytes, in order) and config, and, when
    the server told them, the same server version, registry snapshot and strategy."""
    known = facts is not None and facts.known
    digest = hashlib.sha256(b"autofusion-submit/2\n" if known else b"autofusion-submit/1\n")
    digest.update(f"model {file_sha256(upload.model)}\n".encode())
    for path in upload.data:
        digest.update(f"data {upload.data_name(path)} {file_sha256(path)}\n".encode())
    config = json.dumps(upload.config, sort_keys=True, separators=(",", ":"))
    digest.update(f"config {config}\n".encode())
    if known:
        digest.update(f"server {facts.version}\nregistry {facts.registry_version}\n".encode())
        if facts.strategy:
            digest.update(f"strategy {facts.strategy} {facts.strategy_version}\n".encode())
    return "autofusion-" + digest.hexdigest()


def _when(created: str) -> str:
    """``2026-12-06T07:53:35.834852Z`` as ``2026-12-06 07:53:35 UTC`` (as sent, if odd)."""
    try:
        moment = datetime.fromisoformat(created).astimezone(UTC)
    except (TypeError, ValueError):
        return str(created)
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


def reuse_note(job: dict[str, Any], facts: ServerFacts) -> dict[str, Any]:
    """What a replayed job was made with, and one line saying so: "reused job X from
    <time>, same model, config and registry v7"."""
    registry = facts.registry_version
    if registry is None and isinstance(job.get("registry_version"), int):
        registry = job["registry_version"]  # an older server: the job's own snapshot
    same = "same model, config and " + (f"registry v{registry}" if registry else "registry")
    if facts.strategy:
        shown = f" v{facts.strategy_version}" if facts.strategy_version else ""
        same += f", strategy {facts.strategy}{shown}"
    if facts.version:
        same += f", server {facts.version}"
    created = job.get("created_at")
    when = f" from {_when(created)}" if created else ""
    return {
        "job_id": job.get("id"),
        "created_at": created,
        "registry_version": registry,
        "strategy_version": facts.strategy_version,
        "server_version": facts.version,
        "message": f"reused job {job.get('id')}{when}, {same}",
    }
