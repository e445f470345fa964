"""Makes ``tests/helpers.py`` importable as ``helpers`` without putting tests/ on sys.path.

tests/ mirrors the source tree and holds no ``__init__.py``. With tests/ on sys.path
(what a ``tests/conftest.py`` or ``pythonpath = tests`` would do), the folder
``tests/fusion_core`` is found as a namespace package and shadows the installed
``fusion_core`` whenever the working directory is not on sys.path, e.g. under a bare
``.venv/bin/pytest``. Loading the helper module by its path avoids that.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path


def _load_helpers() -> None:
    path = Path(__file__).resolve().parents[2] / "helpers.py"
    spec = importlib.util.spec_from_file_location("helpers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["helpers"] = module
    spec.loader.exec_module(module)


if "helpers" not in sys.modules:
    _load_helpers()
