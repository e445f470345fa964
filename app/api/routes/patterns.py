"""Routes: the pattern registry. Every change makes a new immutable version."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Request, Response
from starlette.concurrency import run_in_threadpool

from autofusion.app.api.deps import PrincipalDep, SessionDep, SettingsDep, require_scope
from autofusion.app.api.openapi_bodies import binary_part, multipart_body
from autofusion.app.api.problems import problem_responses
from autofusion.app.api.schemas.registry import (
    PatternCreate,
    PatternPublic,
    PatternsPublic,
    PatternTestResult,
    PatternVersionPublic,
    PatternVersionsPublic,
)
from autofusion.app.api.uploads import incoming
from autofusion.app.core.models import PatternRecord
from autofusion.app.services import registry
from autofusion.app.services.auth import Principal
from autofusion.app.services.pattern_trial import read_pattern, trial_upload

router = APIRouter(prefix="/v1/patterns", tags=["patterns"])

PatternWriter = Annotated[Principal, Depends(require_scope("patterns:write"))]
# /test streams its body itself (app/services/uploads/): documented here by hand.
_MODEL_UPLOAD = multipart_body(
    {"model": binary_part("A self-contained ONNX model (no external data).")}
)
IfMatch = Annotated[
    str | None,
    Header(
        description='The ETag you read ("<name>@<version>"), or "*"; a stale one answers 412. '
        "Required on PUT and DELETE (428 without it)."
    ),
]

# A change of an existing version: unknown name, stale ETag, invalid body, no If-Match.
_CHANGE_PROBLEMS = problem_responses(404, 412, 422, 428)


def _with_etag(response: Response, record: PatternRecord) -> PatternPublic:
    response.headers["ETag"] = registry.etag_of(record)
    return PatternPublic.from_record(record)


@router.get("", response_model=PatternsPublic, operation_id="listPatterns")
def list_patterns(session: SessionDep, _: PrincipalDep) -> PatternsPublic:
    """List the patterns (deleted ones excluded) and the registry version."""
    records = registry.list_patterns(session)
    return PatternsPublic.from_records(records, registry.registry_version(session))


@router.post(
    "",
    status_code=201,
    responses=problem_responses(409, 422),
    response_model=PatternPublic,
    operation_id="createPattern",
)
def create_pattern(
    body: PatternCreate, session: SessionDep, principal: PatternWriter, response: Response
) -> PatternPublic:
    """Register a pattern; a spec that does not compile answers 422 naming the field."""
    record = registry.create_pattern(session, body.root, principal.label)
    response.headers["Location"] = f"/v1/patterns/{record.name}"
    return _with_etag(response, record)


@router.get(
    "/{name}",
    response_model=PatternPublic,
    responses=problem_responses(404),
    operation_id="getPattern",
)
def get_pattern(
    name: str, session: SessionDep, _: PrincipalDep, response: Response
) -> PatternPublic:
    """Read a pattern's spec and state, with its ETag."""
    return _with_etag(response, registry.get_pattern(session, name))


@router.put(
    "/{name}",
    responses=_CHANGE_PROBLEMS,
    response_model=PatternPublic,
    operation_id="replacePattern",
)
def replace_pattern(
    name: str,
    body: PatternCreate,
    session: SessionDep,
    principal: PatternWriter,
    response: Response,
    if_match: IfMatch = None,
) -> PatternPublic:
    """Replace a pattern's spec (a new version); If-Match guards against lost updates."""
    record = registry.change_pattern(
        session, name, "update", spec=body.root, if_match=if_match, actor=principal.label
    )
    return _with_etag(response, record)


@router.delete(
    "/{name}",
    status_code=204,
    response_model=None,
    responses=_CHANGE_PROBLEMS,
    operation_id="deletePattern",
)
def delete_pattern(
    name: str, session: SessionDep, principal: PatternWriter, if_match: IfMatch = None
) -> None:
    """Delete a pattern (its history stays readable); If-Match is honoured."""
    registry.change_pattern(session, name, "delete", if_match=if_match, actor=principal.label)


def _state_route(action: str, summary: str):
    """The enable and disable routes: the same change with another action."""

    def route(
        name: str,
        session: SessionDep,
        principal: PatternWriter,
        response: Response,
        if_match: IfMatch = None,
    ) -> PatternPublic:
        record = registry.change_pattern(
            session, name, action, if_match=if_match, actor=principal.label
        )
        return _with_etag(response, record)

    route.__name__ = route.__qualname__ = f"{action}_pattern"
    route.__doc__ = summary
    # If-Match is honoured (412 when stale), not required: enabling is idempotent.
    responses = problem_responses(404, 412)
    return router.post(
        f"/{{name}}/{action}",
        response_model=PatternPublic,
        responses=responses,
        operation_id=f"{action}Pattern",  # enablePattern, disablePattern
    )(route)


enable_pattern = _state_route("enable", "Enable a pattern: the next jobs use it.")
disable_pattern = _state_route("disable", "Disable a pattern: the next jobs leave it out.")


@router.get(
    "/{name}/versions",
    response_model=PatternVersionsPublic,
    responses=problem_responses(404),
    operation_id="listPatternVersions",
)
def list_pattern_versions(name: str, session: SessionDep, _: PrincipalDep) -> PatternVersionsPublic:
    """Every version of a pattern, oldest first, deleted patterns included."""
    return PatternVersionsPublic.from_rows(name, registry.pattern_history(session, name))


@router.get(
    "/{name}/versions/{version}",
    response_model=PatternVersionPublic,
    operation_id="getPatternVersion",
    responses=problem_responses(404),
)
def get_pattern_version(
    name: str,
    # Bounded: a number no column holds is a 422, not the database's overflow (a 500).
    version: Annotated[int, Path(ge=1, le=2**31 - 1)],
    session: SessionDep,
    _: PrincipalDep,
) -> PatternVersionPublic:
    """One immutable version of a pattern."""
    return PatternVersionPublic.model_validate(registry.get_pattern_version(session, name, version))


@router.post(
    "/{name}/test",
    response_model=PatternTestResult,
    operation_id="testPattern",
    openapi_extra=_MODEL_UPLOAD,
    # 422 also when the model runs out of the trial's time or memory; 503 when too
    # many trials run at once (with Retry-After).
    responses=problem_responses(401, 404, 408, 413, 415, 422, 429, 503),
)
async def run_pattern_test(
    name: str, request: Request, settings: SettingsDep, principal: PrincipalDep
) -> PatternTestResult:
    """Run one pattern on a model after the pre-passes: its matches and near misses."""
    # No request session: neither the upload nor the trial (in a child process, up to
    # api_sandbox_time_limit_s) holds a database connection.
    record = await run_in_threadpool(read_pattern, settings, name)
    trial = await trial_upload(
        incoming(request, settings), settings, record, tenant=principal.tenant_id
    )
    return PatternTestResult.from_trial(trial)
