"""Request bodies are bounded in size and in time, for every route (an ASGI middleware).

- Size: uploads (``POST /v1/optimize``, the pattern trials, the dashboard's submit form)
  may send ``max_upload_bytes``; a data upload's part (``PATCH /v1/uploads/{id}``)
  ``max_data_file_bytes``, the most a data file may be (its route holds it to the
  upload's own size); the dashboard's login ``max_login_bytes`` (a few KB);
  every other body ``max_form_bytes``. A ``Content-Length`` over the limit is answered
  413 before a byte of the body is read; a body that passes it while it streams (chunked,
  or a lying length) stops with 413 there.
- Time: a client must keep sending. Counting only the time spent waiting for the client,
  the body must arrive at ``min_body_rate_bytes_s`` once ``body_rate_grace_s`` have
  passed, with no wait over ``body_idle_timeout_s``, and all of it within
  ``body_total_timeout_s``; otherwise 408. An upload stopped either way removes its
  partial folder (``app/services/uploads/`` cleans up on any exception).

Only the body is watched: once it has arrived, ``receive`` is passed through untouched
(it then only reports a disconnect).
"""

from __future__ import annotations

import re
import time
from typing import Any

import anyio
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autofusion.app.api.problems import ProblemError, problem_response
from autofusion.app.core.config import Settings

__all__ = ["BodyLimitError", "BodyLimits", "body_limit_for"]

UPLOAD_PATHS = re.compile(
    r"^/(v1/optimize|ui/submit|v1/patterns/[^/]+/test|ui/patterns/[^/]+/try)/?$"
)
DATA_UPLOAD_PATH = re.compile(r"^/v1/uploads/[^/]+/?$")  # only its PATCH has a body
LOGIN_PATH = "/ui/login"


class BodyLimitError(ProblemError, HTTPException):
    """413 or 408 while the body streams. A ProblemError (the problem handler, the
    dashboard's form errors) and an HTTPException, which FastAPI re-raises as it is
    from its own form parsing instead of turning it into a 400."""

    def __init__(self, status: int, slug: str, title: str, detail: str, **extra: Any) -> None:
        ProblemError.__init__(self, status, slug, title, detail, **extra)
        self.status_code = status
        # The rest of the body is never read: the connection cannot be reused.
        self.headers = {"Connection": "close"}


def body_limit_for(path: str, settings: Settings) -> tuple[int, str]:
    """The byte limit for a request body to ``path`` and the setting that sets it."""
    if UPLOAD_PATHS.match(path):
        return settings.max_upload_bytes, "max_upload_bytes"
    if DATA_UPLOAD_PATH.match(path):
        return settings.max_data_file_bytes, "max_data_file_bytes"
    if path.rstrip("/") == LOGIN_PATH:
        return settings.max_login_bytes, "max_login_bytes"
    return settings.max_form_bytes, "max_form_bytes"


def _too_large(size: str, limit: int, setting: str) -> BodyLimitError:
    return BodyLimitError(
        413,
        "payload-too-large",
        "Payload too large",
        f"the request body {size}; this endpoint accepts at most {limit} bytes ({setting})",
        limit=limit,
    )


def _timed_out(detail: str) -> BodyLimitError:
    return BodyLimitError(
        408,
        "request-timeout",
        "Request timeout",
        f"{detail}; send the body again, without pausing",
    )


class _WatchedBody:
    """``receive`` for the app: counts the body's bytes and the time spent waiting."""

    def __init__(self, receive: Receive, settings: Settings, limit: int, setting: str) -> None:
        self._receive = receive
        self._settings = settings
        self._limit, self._setting = limit, setting
        self._start = time.monotonic()
        self._waited = 0.0
        self._received = 0
        self._done = False

    def _timeout(self) -> tuple[float, str]:
        s = self._settings
        limits = [
            (s.body_idle_timeout_s, f"no data arrived for {s.body_idle_timeout_s:g} s"),
            (
                self._start + s.body_total_timeout_s - time.monotonic(),
                f"the body did not arrive within {s.body_total_timeout_s:g} s",
            ),
        ]
        if s.min_body_rate_bytes_s > 0:
            allowed = s.body_rate_grace_s + self._received / s.min_body_rate_bytes_s
            limits.append(
                (
                    allowed - self._waited,
                    f"the body arrived slower than {s.min_body_rate_bytes_s} bytes/s "
                    "(min_body_rate_bytes_s)",
                )
            )
        return min(limits, key=lambda item: item[0])

    async def __call__(self) -> Message:
        if self._done:
            return await self._receive()
        timeout, reason = self._timeout()
        if timeout <= 0:
            raise _timed_out(reason)
        began = time.monotonic()
        with anyio.move_on_after(timeout) as waiting:
            message = await self._receive()
        self._waited += time.monotonic() - began
        if waiting.cancelled_caught:
            raise _timed_out(reason)
        if message["type"] != "http.request":
            self._done = True  # a disconnect: the app sees it as it is
            return message
        self._received += len(message.get("body", b""))
        if self._received > self._limit:
            raise _too_large(f"passed {self._limit} bytes", self._limit, self._setting)
        if not message.get("more_body", False):
            self._done = True
        return message


class BodyLimits:
    """The middleware: see the module's docstring."""

    def __init__(self, app: ASGIApp, settings: Settings) -> None:
        self.app = app
        self.settings = settings

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit, setting = body_limit_for(scope["path"], self.settings)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            error = _too_large(f"is {declared} bytes", limit, setting)
            response = problem_response(
                error.status,
                error.slug,
                error.title,
                error.detail,
                headers=error.headers,
                **error.extra,
            )
            await response(scope, receive, send)
            return
        await self.app(scope, _WatchedBody(receive, self.settings, limit, setting), send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            # isdigit() alone takes "²", which int() does not: ASCII digits only (a
            # server in front refuses the rest; the streamed count still holds).
            return int(text) if text.isascii() and text.isdigit() else None
    return None
