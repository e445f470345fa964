"""Migrations: upgrade from empty, downgrade, upgrade again, and no drift from the models,
on SQLite and on the real PostgreSQL (the ``postgres_url`` fixture of tests/app/conftest.py:
skipped without PostgreSQL, a failure in .ci/run, which starts it)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from sqlalchemy import inspect

from autofusion.app.core.db import get_engine
from autofusion.app.core.models import Base
from autofusion.app.migrate import check, downgrade, migrations_dir, upgrade


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


# ----- where the migrations come from: the `migrations` package, not a path -----------------


def test_the_migrations_are_the_package_wherever_the_process_runs(tmp_path, monkeypatch) -> None:
    from autofusion import migrations

    monkeypatch.chdir(tmp_path)  # nothing depends on the current directory
    assert migrations_dir() == Path(migrations.__file__).parent
    assert (migrations_dir() / "env.py").is_file()
    upgrade(f"sqlite:///{tmp_path / 'elsewhere.db'}")
    assert _tables(f"sqlite:///{tmp_path / 'elsewhere.db'}") == set(Base.metadata.tables)


def test_a_missing_or_broken_migrations_package_says_to_reinstall(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "autofusion.migrations", None)  # as if the wheel lacked it
    with pytest.raises(RuntimeError, match="reinstall autofusion"):
        migrations_dir()

    # A package in its place without our Alembic environment (a half-removed install).
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "__init__.py").write_text("")
    spec = importlib.util.spec_from_file_location(
        "autofusion.migrations", folder / "__init__.py", submodule_search_locations=[str(folder)]
    )
    broken = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(broken)
    monkeypatch.setitem(sys.modules, "autofusion.migrations", broken)
    with pytest.raises(RuntimeError, match="not autofusion's Alembic environment"):
        migrations_dir()


def test_another_projects_migrations_package_is_not_ours(tmp_path, monkeypatch) -> None:
    """A top-level ``migrations`` of the user's own project shadows nothing of ours."""
    folder = tmp_path / "migrations"
    folder.mkdir()
    (folder / "__init__.py").write_text("THEIRS = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "migrations", raising=False)
    import migrations  # the other project's package, imported on purpose

    assert migrations.THEIRS
    assert (migrations_dir() / "env.py").is_file()
    assert migrations_dir() != folder
