"""Fixtures for the worker tests. The shared code is in ``worker_testing.py`` and
``tests/services.py``, imported as modules (``pythonpath`` in pyproject.toml puts the
repository root on sys.path: ``tests`` is a namespace package)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from tests import services
from tests.worker.worker_testing import WorkerEnv, new_env


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
    with services.fresh_postgres_database() as url:
        yield url


@pytest.fixture
def redis_db() -> Iterator[redis.Redis]:
    with services.empty_redis_db() as client:
        yield client
