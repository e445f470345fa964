"""Migrations: upgrade from empty, downgrade, upgrade again, and no drift from the models,
on SQLite and on the real PostgreSQL (.ci/run starts it)."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import OperationalError

from app.db import get_engine
from app.migrate import check, downgrade, upgrade
from app.models import Base

PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"


@pytest.fixture
def postgres_url() -> Iterator[str]:
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect():
            pass
    except OperationalError:
        pytest.fail("PostgreSQL is not running on 127.0.0.1:5432: run the tests with .ci/run")
    name = f"autofusion_migrations_{os.getpid()}_{int(time.time() * 1000)}"
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    url = f"{PG_SERVER}/{name}"
    try:
        yield url
    finally:
        get_engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def _tables(url: str) -> set[str]:
    return set(inspect(get_engine(url)).get_table_names()) - {"alembic_version"}


def _round_trip(url: str) -> None:
    upgrade(url)
    assert _tables(url) == set(Base.metadata.tables)
    check(url)  # raises when models and migrations disagree
    downgrade(url, "base")
    assert _tables(url) == set()
    upgrade(url)
    assert _tables(url) == set(Base.metadata.tables)
    check(url)


def test_sqlite_upgrade_downgrade_upgrade_and_no_drift(tmp_path) -> None:
    _round_trip(f"sqlite:///{tmp_path / 'af.db'}")


def test_postgresql_upgrade_downgrade_upgrade_and_no_drift(postgres_url: str) -> None:
    _round_trip(postgres_url)
