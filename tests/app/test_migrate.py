"""Migrations: upgrade from empty, downgrade, upgrade again, and no drift from the models,
on SQLite and on the real PostgreSQL (the ``postgres_url`` fixture of tests/app/conftest.py:
skipped without PostgreSQL, a failure in .ci/run, which starts it)."""

from __future__ import annotations

from sqlalchemy import inspect

from app.core.db import get_engine
from app.core.models import Base
from app.migrate import check, downgrade, upgrade


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

