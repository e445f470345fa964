"""What the corpus tier's conftest and tests share: the cache, the CLI, the cases."""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "bench" / "corpus"))

import meta  # noqa: E402  (bench/corpus is not a package)
import node_tests  # noqa: E402

CACHE = meta.cache_dir()
WORKERS = int(os.environ.get("AUTOFUSION_CORPUS_WORKERS", "2"))
CALL_TIMEOUT = 120
RESULTS: dict[str, dict] = {"models": {}, "node_tests": {}}


def cli() -> list[str]:
    """The installed ``autofusion`` command next to this interpreter."""
    script = Path(sys.executable).with_name("autofusion")
    if not script.is_file():
        raise RuntimeError(f"no autofusion script next to {sys.executable}; pip install -e .")
    return [str(script)]


def node_cases() -> dict[str, Path]:
    """The ONNX backend test models the no-traceback test runs (a sample unless
    ``AUTOFUSION_NODE_TESTS=all``)."""
    models = node_tests.all_models(CACHE)
    return models if os.environ.get("AUTOFUSION_NODE_TESTS") == "all" else node_tests.sample(
        models
    )


