"""Run Alembic migrations from code (no alembic.ini: the URL comes from Settings).

The Alembic environment is the ``autofusion.migrations`` package, found with
``importlib.resources``: in a wheel install it sits beside ``autofusion.app``, in a checkout at the
repository root. Nothing depends on the current directory.
"""

from __future__ import annotations

import logging
from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

__all__ = [
    "alembic_config",
    "check",
    "current_revision",
    "downgrade",
    "migrations_dir",
    "upgrade",
]

MIGRATIONS_PACKAGE = "autofusion.migrations"

logger = logging.getLogger(__name__)


def migrations_dir() -> Path:
    """The folder of the installed ``migrations`` package (``env.py``, ``versions/``)."""
    try:
        location = resources.files(MIGRATIONS_PACKAGE)
    except ModuleNotFoundError as exc:
        raise RuntimeError(
            f"no {MIGRATIONS_PACKAGE!r} package next to app: reinstall autofusion"
        ) from exc
    path = Path(str(location))
    if not (path / "env.py").is_file() or not (path / "versions").is_dir():
        raise RuntimeError(
            f"the {MIGRATIONS_PACKAGE!r} package at {location} is not autofusion's Alembic "
            "environment (no env.py and versions/ there): reinstall autofusion"
        )
    return path


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(migrations_dir()))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def current_revision(url: str) -> str | None:
    """The revision the database is at; None for an empty database."""
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()


def upgrade(url: str, revision: str = "head") -> None:
    """Migrate, and say so in one line (Alembic's own line per migration is at debug)."""
    before = current_revision(url)
    command.upgrade(alembic_config(url), revision)
    after = current_revision(url)
    if before == after:
        logger.info("database: schema %s, up to date", after)
    else:
        logger.info("database: schema migrated from %s to %s", before or "empty", after)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def check(url: str) -> None:
    """Raise if the models and the migrations disagree (alembic check)."""
    command.check(alembic_config(url))
