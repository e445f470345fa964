"""Routes: Prometheus metrics (text exposition format).

On a server with API keys a scraper needs a key with the ``metrics:read`` (or ``admin``)
scope, sent as ``Authorization: Bearer`` (Prometheus: ``authorization: {credentials:
...}`` in the scrape config); without keys (embedded on 127.0.0.1) it is open, as every
route is."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from autofusion.app.api.deps import SessionDep, require_scope
from autofusion.app.api.problems import problem_responses
from autofusion.app.services.auth import Principal

__all__ = ["router"]

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    operation_id="getMetrics",
    responses={
        200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"},
        **problem_responses(401, 403),
    },
)
def metrics(
    request: Request,
    _: Annotated[Principal, Depends(require_scope("metrics:read"))],
    session: SessionDep,
) -> Response:
    """Request counts, jobs by status and job/stage durations, for Prometheus."""
    body = request.app.state.metrics.scrape(session)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
