"""Engine and sessions. SQLite gets WAL and a busy timeout so the API and the worker
threads of embedded mode can write concurrently.

PostgreSQL connections are not pinged at checkout (``pool_pre_ping`` costs a round trip
per request, doubling a poll's): a connection that went stale (a database restart) fails
on first use, SQLAlchemy invalidates the pool, and ``retry_stale`` runs the read once
more on a fresh connection. Connections are recycled after ``POOL_RECYCLE_S``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import TypeVar

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

__all__ = [
    "POOL_CONNECTIONS",
    "autocommit_read",
    "get_engine",
    "retry_stale",
    "session_factory",
    "session_scope",
]

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Connections one process's engine may open: SQLAlchemy's pool of 5 plus 10 overflow,
# stated here because the API bounds its concurrent request sessions below it
# (app/api/deps.py).
POOL_SIZE, POOL_OVERFLOW = 5, 10
POOL_CONNECTIONS = POOL_SIZE + POOL_OVERFLOW
POOL_RECYCLE_S = 1800


@lru_cache(maxsize=8)
def get_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        engine = create_engine(
            url,
            connect_args={"check_same_thread": False, "timeout": 30},
            pool_size=POOL_SIZE,
            max_overflow=POOL_OVERFLOW,
        )

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection, _record) -> None:
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA busy_timeout=30000")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.close()

        return engine
    return create_engine(
        url, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW, pool_recycle=POOL_RECYCLE_S
    )


@lru_cache(maxsize=8)
def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


def autocommit_read(session: Session) -> Session:
    """Make ``session``'s next statement a single autocommit read: no BEGIN before it and
    no ROLLBACK when the session closes (on PostgreSQL each is a round trip of its own).
    Call it before the session's first statement, for a one-statement read."""
    session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})
    return session


def retry_stale(session: Session, read: Callable[[Session], T]) -> T:
    """``read(session)``, run once more if its connection turned out to be dead (the
    database restarted since it was pooled). Only for reads: a write may have happened."""
    try:
        return read(session)
    except DBAPIError as exc:
        if not exc.connection_invalidated:
            raise
        logger.info("a pooled database connection was stale; reading again on a fresh one")
        session.rollback()
        return read(session)


@contextmanager
def session_scope(url: str) -> Iterator[Session]:
    """A session that commits on success and rolls back on error."""
    session = session_factory(url)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
