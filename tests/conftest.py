"""What every test shares.

A service running as root starts its sandboxes as an unprivileged user
(``sandbox_user``, ``nobody`` by default), which must be able to pass through the folders
above the data directory (docs/service.md). pytest makes its temporary folders private
(mode 700); here every folder it makes (``tmp_path``, ``tmp_path_factory.mktemp``), and
the folders above it, are made searchable, not listable, by others (mode 711), as a
deployment's data directory would be.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

import pytest


def searchable(path: Path) -> Path:
    """``path`` and its parents below the system's temporary folder: searchable by others."""
    top = Path(tempfile.gettempdir()).resolve()
    for folder in [path.resolve(), *path.resolve().parents]:
        if folder == top or top not in folder.parents:
            break
        mode = folder.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(folder, stat.S_IMODE(mode) | stat.S_IXGRP | stat.S_IXOTH)
    return path


_private_mktemp = pytest.TempPathFactory.mktemp


def _searchable_mktemp(self: pytest.TempPathFactory, basename: str, numbered: bool = True) -> Path:
    return searchable(_private_mktemp(self, basename, numbered))


# tmp_path is made by mktemp too.
pytest.TempPathFactory.mktemp = _searchable_mktemp  # type: ignore[method-assign]
