"""Every request has an id: the client's ``X-Request-ID`` when it is acceptable
(``app.core.logs.clean_request_id``: at most 128 characters of a safe alphabet), else a
new one. It is echoed on every response (errors and the body-limit refusals included:
this middleware is the outermost), set as the request's logging context, so that every
log line of the request carries it, and kept as ``request.state.request_id``; a job the
request creates records it (``Job.request_id``) and the worker logs under it.
"""

from __future__ import annotations

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autofusion.app.core import tracing
from autofusion.app.core.logs import (
    REQUEST_ID_HEADER,
    clean_request_id,
    new_request_id,
    set_context,
)

__all__ = ["RequestIdMiddleware", "request_id_of"]

_HEADER = REQUEST_ID_HEADER.lower().encode("latin-1")


def request_id_of(scope: Scope) -> str:
    """The client's acceptable ``X-Request-ID``, or a new id."""
    for name, value in scope.get("headers", ()):
        if name == _HEADER:
            return clean_request_id(value.decode("latin-1")) or new_request_id()
    return new_request_id()


class RequestIdMiddleware:
    """Pure ASGI (streams pass through untouched)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = request_id_of(scope)
        scope.setdefault("state", {})["request_id"] = request_id
        set_context(request_id=request_id)
        tracing.annotate(request_id=request_id)  # the request's span, when tracing

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)[REQUEST_ID_HEADER] = request_id
            await send(message)

        await self.app(scope, receive, send_with_id)
