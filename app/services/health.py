"""Readiness: can this process reach what a request needs (database, broker, artifact
store), and can a worker take the job it queues (``app.services.worker_health``)?

Each check returns ``None`` when healthy or a short reason; ``/readyz`` answers 503 with
the reasons when any fails. Checks are quick and bounded by short timeouts.
"""

from __future__ import annotations

import logging
import os
import tempfile

from sqlalchemy import text

from autofusion.app.core.config import Settings
from autofusion.app.core.db import get_engine
from autofusion.app.services.worker_health import LocalWorker, check_worker

__all__ = ["check_artifacts", "check_broker", "check_database", "readiness"]

logger = logging.getLogger(__name__)

_TIMEOUT_S = 2.0


def check_database(settings: Settings) -> str | None:
    try:
        with get_engine(settings.resolved_database_url).connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as exc:  # any driver error means "not ready"
        logger.warning("readiness: database unreachable: %s", exc)
        return f"database unreachable ({type(exc).__name__})"
    return None


def check_broker(settings: Settings) -> str | None:
    url = settings.resolved_broker_url
    if settings.is_embedded_broker:
        return _check_folder_writable(settings.broker_dir)
    try:
        if url.startswith(("redis://", "rediss://")):
            import redis

            client = redis.Redis.from_url(
                url, socket_connect_timeout=_TIMEOUT_S, socket_timeout=_TIMEOUT_S
            )
            try:
                client.ping()
            finally:
                client.close()
        else:
            from kombu import Connection

            with Connection(url, connect_timeout=_TIMEOUT_S) as connection:
                connection.ensure_connection(max_retries=1)
    except Exception as exc:  # any client error means "not ready"
        logger.warning("readiness: broker unreachable: %s", exc)
        return f"broker unreachable ({type(exc).__name__})"
    return None


def check_artifacts(settings: Settings) -> str | None:
    """The local artifact folder takes a file, or the S3 bucket answers (HEAD bucket,
    with the store's own credentials and short timeouts)."""
    if settings.artifact_store == "local":
        return _check_folder_writable(settings.artifacts_dir, "artifact")
    try:
        import boto3
        from botocore.config import Config

        config = Config(
            connect_timeout=_TIMEOUT_S, read_timeout=_TIMEOUT_S, retries={"max_attempts": 1}
        )
        client = boto3.client("s3", config=config, **settings.s3_client_options())
        client.head_bucket(Bucket=settings.s3_bucket)
    except Exception as exc:  # unreachable, no such bucket, refused credentials
        logger.warning("readiness: S3 bucket %r unreachable: %s", settings.s3_bucket, exc)
        return f"S3 bucket {settings.s3_bucket!r} unreachable ({_s3_reason(exc)})"
    return None


def _s3_reason(exc: Exception) -> str:
    code = getattr(exc, "response", {}).get("Error", {}).get("Code")
    return f"{type(exc).__name__} {code}" if code else type(exc).__name__


def _check_folder_writable(folder: os.PathLike, what: str = "broker") -> str | None:
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"{what} folder {os.fspath(folder)!r} is missing or not writable ({exc.strerror})"
    return None


def readiness(settings: Settings, local: LocalWorker | None = None) -> dict[str, str | None]:
    """``{check name: None or reason}`` for every dependency; ``worker`` too unless
    ``readyz_requires_worker`` is off (``local``: the embedded worker beside this process)."""
    results = {
        "database": check_database(settings),
        "broker": check_broker(settings),
        "artifacts": check_artifacts(settings),
    }
    if settings.readyz_requires_worker:
        # Without the database no heartbeat can be read: say so, without a second timeout.
        unreadable = "unknown: the database is unreachable"
        results["worker"] = unreadable if results["database"] else check_worker(settings, local)
    return results
