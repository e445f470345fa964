"""Run Alembic migrations from code (no alembic.ini: the URL comes from Settings).

The Alembic environment is the ``autofusion.migrations`` package, found with
``importlib.resources``: in a wheel install it sits beside ``autofusion.app``, in a checkout at the
repository root. Nothing depends on the current directory.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from alembic import command
from alembic.config import Config

__all__ = ["alembic_config", "check", "downgrade", "migrations_dir", "upgrade"]

MIGRATIONS_PACKAGE = "autofusion.migrations"


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


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def check(url: str) -> None:
    """Raise if the models and the migrations disagree (alembic check)."""
    command.check(alembic_config(url))
