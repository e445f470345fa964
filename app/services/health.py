"""Readiness: can this process reach what a request needs (database, broker)?

Each check returns ``None`` when healthy or a short reason; ``/readyz`` answers 503 with
the reasons when any fails. Checks are quick and bounded by short timeouts.
"""

from __future__ import annotations

import logging
import os
import tempfile

from sqlalchemy import text

from app.core.config import Settings
from app.core.db import get_engine

__all__ = ["check_broker", "check_database", "readiness"]

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


def _check_folder_writable(folder: os.PathLike) -> str | None:
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"broker folder {os.fspath(folder)!r} is missing or not writable ({exc.strerror})"
    return None


def readiness(settings: Settings) -> dict[str, str | None]:
    """``{check name: None or reason}`` for every dependency."""
    return {"database": check_database(settings), "broker": check_broker(settings)}
