"""Routes: named strategies (``default``, ``vision``, ``nlp``...), versioned like patterns."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Response

from autofusion.app.api.deps import PrincipalDep, SessionDep, require_scope
from autofusion.app.api.problems import problem_responses
from autofusion.app.api.schemas.registry import (
    StrategiesPublic,
    StrategyCreate,
    StrategyPublic,
    StrategyVersionsPublic,
)
from autofusion.app.core.models import Strategy
from autofusion.app.services import strategies
from autofusion.app.services.auth import Principal

router = APIRouter(prefix="/v1/strategies", tags=["strategies"])

StrategyWriter = Annotated[Principal, Depends(require_scope("patterns:write"))]
IfMatch = Annotated[
    str | None,
    Header(
        description='The ETag you read ("<name>@<version>"), or "*"; a stale one answers 412. '
        "Required on PUT and DELETE (428 without it)."
    ),
]

# A change of an existing version: unknown name, stale ETag, invalid body, no If-Match.
_CHANGE_PROBLEMS = problem_responses(404, 412, 422, 428)


def _with_etag(response: Response, strategy: Strategy) -> StrategyPublic:
    response.headers["ETag"] = strategies.strategy_etag(strategy)
    return StrategyPublic.from_row(strategy)


@router.get("", response_model=StrategiesPublic, operation_id="listStrategies")
def list_strategies(session: SessionDep, _: PrincipalDep) -> StrategiesPublic:
    """List the named strategies."""
    return StrategiesPublic.from_rows(strategies.list_strategies(session))


@router.post(
    "",
    status_code=201,
    responses=problem_responses(409, 422),
    response_model=StrategyPublic,
    operation_id="createStrategy",
)
def create_strategy(
    body: StrategyCreate, session: SessionDep, _: StrategyWriter, response: Response
) -> StrategyPublic:
    """Create a strategy; every pattern it names must exist (422 otherwise)."""
    strategy = strategies.create_strategy(session, body)
    response.headers["Location"] = f"/v1/strategies/{strategy.name}"
    return _with_etag(response, strategy)


@router.get(
    "/{name}",
    response_model=StrategyPublic,
    responses=problem_responses(404),
    operation_id="getStrategy",
)
def get_strategy(
    name: str, session: SessionDep, _: PrincipalDep, response: Response
) -> StrategyPublic:
    """Read a strategy, with its ETag."""
    return _with_etag(response, strategies.get_strategy(session, name))


@router.put(
    "/{name}",
    responses=_CHANGE_PROBLEMS,
    response_model=StrategyPublic,
    operation_id="replaceStrategy",
)
def replace_strategy(
    name: str,
    body: StrategyCreate,
    session: SessionDep,
    _: StrategyWriter,
    response: Response,
    if_match: IfMatch = None,
) -> StrategyPublic:
    """Replace a strategy (a new version); If-Match guards against lost updates."""
    strategy = strategies.update_strategy(session, name, body, if_match=if_match)
    return _with_etag(response, strategy)


@router.get(
    "/{name}/versions",
    response_model=StrategyVersionsPublic,
    responses=problem_responses(404),
    operation_id="listStrategyVersions",
)
def list_strategy_versions(
    name: str, session: SessionDep, _: PrincipalDep
) -> StrategyVersionsPublic:
    """Every version of a strategy, oldest first."""
    return StrategyVersionsPublic.from_rows(name, strategies.strategy_history(session, name))
