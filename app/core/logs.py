"""The service's logs: one line per record, JSON or plain text, each carrying the request
id (and job id) it belongs to.

* ``configure_logging(level, fmt)`` sets up the root logger of a process (``autofusion
  serve``, ``autofusion worker``, the job sandbox). ``fmt`` is ``json`` (python-json-logger:
  one object a line, for a log collector), ``text`` (for a person), or ``auto``: text
  when the stream is a terminal, JSON otherwise (``AUTOFUSION_LOG_FORMAT``).
* ``request_id`` and ``job_id`` are context variables: the API's request-id middleware
  (``app.api.request_ids``) sets the first for each request, the worker sets both for
  the job it runs (``bind``), and ``ContextFilter`` copies them onto every record, so a
  line logged anywhere below (a service, SQLAlchemy, uvicorn's access line) has them.
* ``clean_request_id`` accepts an incoming ``X-Request-ID`` only if it is short and of
  a safe alphabet (no spaces, quotes, control characters): a hostile header can neither
  forge log lines nor fill them.

Standard library only at import (the sandbox imports this once its memory limit is set).
"""

from __future__ import annotations

import logging
import re
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Literal, TextIO

__all__ = [
    "REQUEST_ID_HEADER",
    "ContextFilter",
    "QuietStartFilter",
    "LogFormat",
    "bind",
    "clean_request_id",
    "configure_logging",
    "current_request_id",
    "make_handler",
    "new_request_id",
    "resolve_format",
    "set_context",
]

REQUEST_ID_HEADER = "X-Request-ID"
MAX_REQUEST_ID = 128
# Letters, digits and the punctuation ids are made of (UUIDs, W3C trace ids, AWS's
# "Root=1-...;Parent=..."); nothing that could end a log line, a JSON string or a field.
_REQUEST_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:;=+/@-]*")
_TEXT_FORMAT = "%(asctime)s %(levelname)s [%(request_id)s] %(name)s: %(message)s"
_JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(process)d %(message)s"

LogFormat = Literal["auto", "json", "text"]

_request_id: ContextVar[str | None] = ContextVar("autofusion_request_id", default=None)
_job_id: ContextVar[str | None] = ContextVar("autofusion_job_id", default=None)


def clean_request_id(value: str | None) -> str | None:
    """``value`` if it may be used as a request id, else None (the caller makes one)."""
    if value is None or not 0 < len(value) <= MAX_REQUEST_ID:
        return None
    return value if _REQUEST_ID.fullmatch(value) else None


def new_request_id() -> str:
    return uuid.uuid4().hex


def current_request_id() -> str | None:
    """The request id of the request (or job) this code runs for; None outside one."""
    return _request_id.get()


@contextmanager
def bind(*, request_id: str | None = None, job_id: str | None = None) -> Iterator[None]:
    """Log lines inside the block carry these ids (a job's, in the worker)."""
    tokens = (_request_id.set(clean_request_id(request_id)), _job_id.set(job_id))
    try:
        yield
    finally:
        _job_id.reset(tokens[1])
        _request_id.reset(tokens[0])


def set_context(*, request_id: str | None = None, job_id: str | None = None) -> None:
    """Set the ids for the rest of this context, with no block to end: the request-id
    middleware (every request is a task of its own, whose context ends with it) and a
    sandbox child (one job a process)."""
    _request_id.set(clean_request_id(request_id))
    if job_id is not None:
        _job_id.set(job_id)


class ContextFilter(logging.Filter):
    """Puts ``request_id`` and ``job_id`` on every record (None outside a request or job;
    an id a caller passed in ``extra`` stays)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "request_id", None) is None:
            record.request_id = _request_id.get()
        if getattr(record, "job_id", None) is None:
            record.job_id = _job_id.get()
        return True


class _TextFormatter(logging.Formatter):
    """``_TEXT_FORMAT``, with ``-`` for a record outside any request."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        values = dict(vars(record), request_id=getattr(record, "request_id", None) or "-")
        return self._fmt % values if self._fmt else record.getMessage()


def _json_formatter() -> logging.Formatter:
    """python-json-logger's formatter: the standard fields renamed, ISO times in UTC, and
    every extra attribute (``request_id``, ``job_id``) a field of its own."""
    from pythonjsonlogger.core import RESERVED_ATTRS
    from pythonjsonlogger.json import JsonFormatter

    class _Formatter(JsonFormatter):
        def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
            return datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")

    return _Formatter(
        _JSON_FIELDS,
        rename_fields={"asctime": "time", "levelname": "level", "name": "logger"},
        # uvicorn's copy of its message with terminal colours: noise in a log collector.
        reserved_attrs=[*RESERVED_ATTRS, "color_message"],
        json_ensure_ascii=False,
    )


def resolve_format(fmt: LogFormat, stream: TextIO) -> Literal["json", "text"]:
    """``auto``: text on a terminal, JSON otherwise."""
    if fmt != "auto":
        return fmt
    isatty = getattr(stream, "isatty", None)
    return "text" if isatty is not None and isatty() else "json"


# Lines other libraries log at start and stop that say nothing a user acts on: Alembic's
# plugin setup and per-migration messages (app/migrate.py logs one line instead),
# uvicorn's lifecycle lines (serve logs the URL itself), Celery's broker connection and
# kombu's warning that a filesystem:// URL has no host. Shown at debug level only.
_NOISE_PREFIXES = ("alembic.",)
_NOISE_MESSAGES = {
    "uvicorn.error": (
        "Started server process",
        "Waiting for application startup",
        "Application startup complete",
        "Uvicorn running on",
        "Waiting for application shutdown",
        "Application shutdown complete",
        "Finished server process",
    ),
    "celery.worker.consumer.connection": ("Connected to",),
    "kombu.connection": ("No hostname was supplied",),
}


class QuietStartFilter(logging.Filter):
    """Drops the start and stop noise above unless the root logger is at debug level;
    a warning or an error from the same loggers always passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        if logging.getLogger().getEffectiveLevel() <= logging.DEBUG:
            return True
        if record.name.startswith(_NOISE_PREFIXES):
            return record.levelno > logging.INFO
        prefixes = _NOISE_MESSAGES.get(record.name)
        return prefixes is None or not str(record.msg).startswith(prefixes)


def make_handler(fmt: LogFormat, stream: TextIO | None = None) -> logging.Handler:
    stream = sys.stderr if stream is None else stream
    handler = logging.StreamHandler(stream)
    handler.addFilter(ContextFilter())
    handler.addFilter(QuietStartFilter())
    if resolve_format(fmt, stream) == "json":
        handler.setFormatter(_json_formatter())
    else:
        handler.setFormatter(_TextFormatter(_TEXT_FORMAT))
    return handler


def configure_logging(
    level: str | int = "INFO", fmt: LogFormat = "auto", stream: TextIO | None = None
) -> logging.Handler:
    """The root logger of this process writes ``fmt`` lines to ``stream`` (stderr):
    its handlers are replaced by this one. Returns the handler."""
    handler = make_handler(fmt, stream)
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper() if isinstance(level, str) else level)
    logging.captureWarnings(True)
    return handler
