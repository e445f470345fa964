"""Capturing what the service logs, as it writes it: ``json_log_lines()`` adds the
service's own JSON handler (``app.core.logs.make_handler``) to the root logger for the
block and yields its stream. Shared by the API's and the worker's request-id tests."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["json_log_lines", "records"]


@contextmanager
def json_log_lines(level: int = logging.INFO) -> Iterator[io.StringIO]:
    from autofusion.app.core.logs import make_handler

    stream = io.StringIO()
    handler = make_handler("json", stream)
    root = logging.getLogger()
    saved = root.level
    root.addHandler(handler)
    root.setLevel(level)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(saved)


def records(stream: io.StringIO) -> list[dict[str, Any]]:
    """Each line parsed: each must be one JSON object."""
    return [json.loads(line) for line in stream.getvalue().splitlines() if line.strip()]
