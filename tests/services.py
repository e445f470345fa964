"""The real PostgreSQL and Redis of this machine, isolated per test (.ci/run starts both).

Each helper takes ``on_missing``, called with a message when the service is down:
``pytest.skip`` or ``pytest.fail``, as the calling test decides.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from app.core.db import get_engine

PG_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"
REDIS_HOST, REDIS_PORT = "127.0.0.1", 6379


@contextmanager
def fresh_postgres_database(on_missing: Callable[[str], object]) -> Iterator[str]:
    """The URL of a new, empty database, dropped afterwards."""
    admin = create_engine(f"{PG_SERVER}/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect():
            pass
    except OperationalError:
        on_missing("PostgreSQL is not running on 127.0.0.1:5432 (.ci/run starts it)")
        raise
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
def empty_redis_db(on_missing: Callable[[str], object]) -> Iterator[redis.Redis]:
    """A client on an empty Redis database number of our own (claimed), flushed after."""
    try:
        redis.Redis(host=REDIS_HOST, port=REDIS_PORT, socket_timeout=5).ping()
    except redis.RedisError:
        on_missing("Redis is not running on 127.0.0.1:6379 (.ci/run starts it)")
        raise
    for number in random.sample(range(1, 16), 15):
        client = redis.Redis(host=REDIS_HOST, port=REDIS_PORT, db=number, socket_timeout=5)
        if client.dbsize() == 0 and client.set("autofusion-test-claim", "1", nx=True):
            try:
                yield client
            finally:
                client.flushdb()
                client.close()
            return
    on_missing("no empty Redis database number to use")
    raise RuntimeError("no empty Redis database number to use")


def redis_url(client: redis.Redis) -> str:
    return f"redis://{REDIS_HOST}:{REDIS_PORT}/{client.connection_pool.connection_kwargs['db']}"
