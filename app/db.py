"""Engine and sessions. SQLite gets WAL and a busy timeout so the API and the worker
threads of embedded mode can write concurrently; PostgreSQL needs nothing special."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

__all__ = ["POOL_CONNECTIONS", "get_engine", "session_factory", "session_scope"]

# Connections one process's engine may open: SQLAlchemy's pool of 5 plus 10 overflow,
# stated here because the API bounds its concurrent request sessions below it
# (app/api/deps.py).
POOL_SIZE, POOL_OVERFLOW = 5, 10
POOL_CONNECTIONS = POOL_SIZE + POOL_OVERFLOW


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
    return create_engine(url, pool_pre_ping=True, pool_size=POOL_SIZE, max_overflow=POOL_OVERFLOW)


@lru_cache(maxsize=8)
def session_factory(url: str) -> sessionmaker[Session]:
    return sessionmaker(get_engine(url), expire_on_commit=False)


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
