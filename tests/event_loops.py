"""``asyncio.run`` for tests, in a thread of its own.

The browser tests' session-long Playwright keeps an event loop running in the main
thread, where ``asyncio.run()`` refuses to start another ("cannot be called from a
running event loop"). Under pytest-xdist any test file may run after them in the same
process, so every test that runs a coroutine to the end does it here."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_coroutine(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coroutine)`` in a fresh thread; its result, or its exception."""
    with ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()
