"""Real-service fixtures for the worker tests (PostgreSQL and Redis, isolated)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis


def _load_services():
    """tests/services.py, loaded by path (see tests/fusion_core/rewriters/conftest.py)."""
    path = Path(__file__).resolve().parents[1] / "services.py"
    spec = importlib.util.spec_from_file_location("_autofusion_test_services", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


services = sys.modules.get("_autofusion_test_services") or _load_services()


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    with services.fresh_postgres_database(pytest.skip) as url:
        yield url


@pytest.fixture
def redis_db() -> Iterator[redis.Redis]:
    with services.empty_redis_db(pytest.skip) as client:
        yield client
