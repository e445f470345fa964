"""Retrying a database write through a short outage (a restart, a failover, a dropped
connection) instead of losing what it records. Used for a worker's final write of a
finished attempt (worker/execute.py), bounded by ``final_write_retry_s``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError

__all__ = ["is_transient_db_error", "retry_transient"]

logger = logging.getLogger(__name__)

T = TypeVar("T")
_sleep = time.sleep  # the backoff's wait (tests record it instead)


def is_transient_db_error(exc: BaseException) -> bool:
    """A database error that a later try may not meet: the server went away, restarted
    or refused connections (sqlalchemy's OperationalError, a DBAPI error that invalidated
    its connection, a bare psycopg OperationalError). Constraint violations and bad SQL
    are not: they fail the same way every time."""
    if isinstance(exc, OperationalError):
        return True
    if isinstance(exc, DBAPIError) and exc.connection_invalidated:
        return True
    try:
        import psycopg
    except ImportError:  # SQLite only: nothing more to recognise
        return False
    return isinstance(exc, psycopg.OperationalError)


def retry_transient(
    operation: Callable[[], T],
    *,
    budget_s: float,
    what: str,
    first_delay_s: float = 0.25,
    max_delay_s: float = 8.0,
) -> T:
    """``operation()``, tried again with exponential backoff (0.25 s, 0.5 s, ... at most
    ``max_delay_s``) while it raises a transient database error and ``budget_s`` seconds
    have not passed since the first try; then the last error is raised. ``operation``
    must be safe to repeat: each try opens its own session (a failed one rolled back)."""
    deadline = time.monotonic() + budget_s
    delay = first_delay_s
    tries = 0
    while True:
        tries += 1
        try:
            return operation()
        except Exception as exc:
            left = deadline - time.monotonic()
            if not is_transient_db_error(exc) or left <= 0:
                raise
            logger.warning(
                "%s: database error (try %d, again in %.2g s, %.0f s left): %s",
                what,
                tries,
                min(delay, left),
                left,
                str(exc).splitlines()[0] if str(exc) else type(exc).__name__,
            )
            _sleep(min(delay, left))
            delay = min(delay * 2, max_delay_s)
