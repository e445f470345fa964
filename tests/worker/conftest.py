"""Fixtures for the worker tests. The shared code is in ``worker_testing.py``, loaded by
its path so that tests/ never goes on sys.path (see tests/fusion_core/rewriters/conftest.py).
"""

from __future__ import annotations

import importlib.util
import itertools
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis


def _load_support() -> None:
    path = Path(__file__).resolve().parent / "worker_testing.py"
    spec = importlib.util.spec_from_file_location("worker_testing", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["worker_testing"] = module
    spec.loader.exec_module(module)


if "worker_testing" not in sys.modules:
    _load_support()


def _load_services():
    """tests/services.py: the real PostgreSQL and Redis, isolated per test."""
    path = Path(__file__).resolve().parents[1] / "services.py"
    spec = importlib.util.spec_from_file_location("_autofusion_test_services", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


services = sys.modules.get("_autofusion_test_services") or _load_services()

from worker_testing import WorkerEnv, new_env  # noqa: E402


@pytest.fixture
def make_env(tmp_path: Path) -> Iterator[Callable[..., WorkerEnv]]:
    """``make_env(**settings)``: a fresh env (database, store, scratch) in ``tmp_path``."""
    counter = itertools.count()

    def make(*, seed: bool = True, **overrides: Any) -> WorkerEnv:
        return new_env(tmp_path / f"env{next(counter)}", seed=seed, **overrides)

    yield make


@pytest.fixture
def env(make_env: Callable[..., WorkerEnv]) -> WorkerEnv:
    return make_env()


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    with services.fresh_postgres_database(pytest.skip) as url:
        yield url


@pytest.fixture
def redis_db() -> Iterator[redis.Redis]:
    with services.empty_redis_db(pytest.skip) as client:
        yield client
