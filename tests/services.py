"""The real PostgreSQL and Redis of this machine, isolated per test (.ci/run starts both).

Where a service is not running, the tests that need it skip, with a reason that names
the service and where it was looked for: ``make test`` needs only Python. With
``AUTOFUSION_REQUIRE_SERVICES=1`` (``.ci/run`` sets it, as it sets
``AUTOFUSION_REQUIRE_BROWSER`` for chromium) the same tests fail instead, so a CI run
never passes by skipping them.
"""

from __future__ import annotations

import os
import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from autofusion.app.core.db import get_engine

PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379
REQUIRE_ENV = "AUTOFUSION_REQUIRE_SERVICES"
CONNECT_TIMEOUT_S = 5


def services_required() -> bool:
    return os.environ.get(REQUIRE_ENV, "") not in ("", "0")


def unavailable(
    service: str, where: str, why: str, on_missing: Callable[[str], object] | None = None
) -> NoReturn:
    """Skip the calling test (or call ``on_missing``), or fail it where ``REQUIRE_ENV``
    is set: ``service`` (its name) at ``where`` cannot be used, for reason ``why``."""
    message = f"{service} is not available at {where} ({why}); .ci/run starts it"
    if services_required():
        pytest.fail(f"{REQUIRE_ENV} is set but {message}")
    (on_missing or pytest.skip)(message)
    raise RuntimeError(message)


def _why(exc: BaseException) -> str:
    """The gist of a connection error: its first line, after the last colon."""
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return first.rsplit(": ", 1)[-1].strip() or type(exc).__name__


@contextmanager
def fresh_postgres_database(on_missing: Callable[[str], object] | None = None) -> Iterator[str]:
    """The URL of a new, empty database, dropped afterwards."""
    admin = create_engine(
        f"{PG_SERVER}/postgres",
        isolation_level="AUTOCOMMIT",
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )
    try:
        with admin.connect():
            pass
    except OperationalError as exc:
        admin.dispose()
        where = PG_SERVER.rsplit("@", 1)[-1]
        unavailable("PostgreSQL", where, _why(exc.orig or exc), on_missing)
    url = f"{PG_SERVER}/autofusion_test_{uuid.uuid4().hex[:12]}"
    name = url.rsplit("/", 1)[1]
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield url
    finally:
        get_engine(url).dispose()
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def empty_redis_db(on_missing: Callable[[str], object] | None = None) -> Iterator[redis.Redis]:
    """A client on an empty Redis database number of our own (claimed), flushed after."""
    probe = redis.Redis(
        host=REDIS_HOST,
        port=REDIS_PORT,
        socket_timeout=CONNECT_TIMEOUT_S,
        socket_connect_timeout=CONNECT_TIMEOUT_S,
        retry=Retry(NoBackoff(), 0),  # a refused connection is an answer: no backoff
    )
    try:
        probe.ping()
    except redis.RedisError as exc:
        unavailable("Redis", f"{REDIS_HOST}:{REDIS_PORT}", _why(exc), on_missing)
    finally:
        probe.close()
    for number in random.sample(range(1, 16), 15):
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number, socket_timeout=5)
        if client.dbsize() == 0 and client.set("autofusion-test-claim", "1", nx=True):
            try:
                yield client
            finally:
                client.flushdb()
                client.close()
            return
    unavailable("Redis", f"{REDIS_HOST}:{REDIS_PORT}", "no empty database 1-15 to use", on_missing)


def redis_url(client: redis.Redis) -> str:
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{client.connection_pool.connection_kwargs['db']}"
