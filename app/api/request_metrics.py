"""The API's side of the metrics: the ASGI middleware that counts and times every
request, and the app's own registry (``app.services.metrics.Metrics``: no global
state)."""

from __future__ import annotations

import time

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from autofusion.app.services.metrics import Metrics

__all__ = ["MetricsMiddleware", "install_metrics"]


class MetricsMiddleware:
    """Counts and times every HTTP request by route template and status (pure ASGI:
    streams pass through; the time ends when the app has sent the last byte)."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # an exception that escapes becomes a 500 outside this middleware
        started = time.perf_counter()

        async def send_and_record(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_and_record)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            seconds = time.perf_counter() - started
            self.metrics.observe_request(scope["method"], route, status, seconds)


def install_metrics(app: FastAPI) -> Metrics:
    """Give ``app`` its own registry (``app.state.metrics``) and the counting middleware."""
    metrics = Metrics()
    app.state.metrics = metrics
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    return metrics
