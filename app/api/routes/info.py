"""Route: ``GET /v1/info``, what a job submitted now would run with (one cheap read)."""

from __future__ import annotations

from fastapi import APIRouter

from autofusion.app.api.deps import PrincipalDep, SessionDep
from autofusion.app.api.problems import problem_responses
from autofusion.app.api.schemas.info import ServerInfoPublic
from autofusion.app.services.server_info import server_info

__all__ = ["router"]

router = APIRouter(tags=["info"])


@router.get(
    "/v1/info",
    response_model=ServerInfoPublic,
    operation_id="getServerInfo",
    responses=problem_responses(401),
)
def read_info(session: SessionDep, _: PrincipalDep) -> ServerInfoPublic:
    """The server's version, registry snapshot and strategy versions (a client's reuse key)."""
    return ServerInfoPublic.from_info(server_info(session))
