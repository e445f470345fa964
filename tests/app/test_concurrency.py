"""Many clients at once against a real server: no deadlock between the thread pool that
runs sync routes and the database connection pool, and no race on the first request.

A request used to hold its connection while it waited for a worker thread (for the
route, or for the session's sync teardown), so with more requests in flight than
connections every thread ended up waiting for a connection held by a request waiting
for a thread: nothing moved for the pool's 30 s timeout, then a burst of 500s.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections import Counter

import httpx
import pytest
import uvicorn

from autofusion.app.core.config import Settings
from autofusion.app.main import create_app
from tests.event_loops import run_coroutine

CLIENTS = 64  # well above the pool's 5 + 10 connections and the 40 worker threads
REQUESTS_PER_CLIENT = 5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def server_url(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", embedded_worker=False)
    port = _free_port()
    config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="error")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=30)


async def _hammer(url: str, paths: list[str]) -> tuple[Counter, float]:
    statuses: Counter = Counter()
    limits = httpx.Limits(max_connections=CLIENTS)
    # Far below the pool's 30 s wait: a stall fails here, not as a slow pass.
    timeout = httpx.Timeout(20.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as client:

        async def one_client(k: int) -> None:
            for i in range(REQUESTS_PER_CLIENT):
                try:
                    response = await client.get(paths[(k + i) % len(paths)])
                    statuses[response.status_code] += 1
                except httpx.TimeoutException:
                    statuses["timeout"] += 1

        start = time.perf_counter()
        await asyncio.gather(*(one_client(k) for k in range(CLIENTS)))
        return statuses, time.perf_counter() - start


@pytest.mark.slow
def test_many_concurrent_clients_on_a_fresh_server_all_get_answers(server_url):
    # The very first requests also race to create the default tenant.
    paths = ["/v1/jobs", "/v1/patterns", "/v1/strategies", "/v1/jobs?status=running"]
    statuses, _ = run_coroutine(_hammer(server_url, paths))
    assert statuses == Counter({200: CLIENTS * REQUESTS_PER_CLIENT}), statuses
