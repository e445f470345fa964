"""Routes: Prometheus metrics (text exposition format). No auth: scrapers call it."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST

from app.api.deps import SessionDep

__all__ = ["router"]

router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    response_class=Response,
    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text"}},
)
def metrics(request: Request, session: SessionDep) -> Response:
    """Request counts, jobs by status and job/stage durations, for Prometheus."""
    body = request.app.state.metrics.scrape(session)
    return Response(body, media_type=CONTENT_TYPE_LATEST)
