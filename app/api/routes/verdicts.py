"""Routes: the verdict store (issue 28). What measured selection learned, shared by every
worker: listed a page at a time with filters, exported as a verdicts file, and
imported from one (an admin's, to seed a new server from a trusted one).

Verdicts are shared across tenants (``verdicts_shared``), jobs are not: a verdict's
``job_id`` is shown only to the tenant whose job measured it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from autofusion.app.api.deps import PrincipalDep, SessionDep, SettingsDep, require_scope
from autofusion.app.api.problems import problem_responses
from autofusion.app.api.schemas.verdicts import VerdictsFile, VerdictsImported, VerdictsPublic
from autofusion.app.core.db import retry_stale
from autofusion.app.core.errors import ProblemError
from autofusion.app.services import verdicts
from autofusion.app.services.auth import Principal
from autofusion.app.services.job_pages import PAGE_SIZE_DEFAULT, PAGE_SIZE_MAX
from autofusion.app.services.verdict_pages import list_verdicts

__all__ = ["router"]

router = APIRouter(prefix="/v1/verdicts", tags=["verdicts"])

# An import adds to what every tenant's jobs reuse: the server's administrators only.
AdminDep = Annotated[Principal, Depends(require_scope("admin"))]
_HEX64 = "^[0-9a-f]{64}$"


def _filters(
    pattern: Annotated[str | None, Query(max_length=200, description="The pattern's name")] = None,
    verdict: Annotated[
        Literal["faster", "no measurable change", "slower"] | None,
        Query(description="How it measured"),
    ] = None,
    signature: Annotated[
        str | None, Query(pattern=_HEX64, description="The region signature")
    ] = None,
    machine_key: Annotated[
        str | None, Query(pattern=_HEX64, description="The machine class")
    ] = None,
    onnxruntime: Annotated[
        str | None, Query(max_length=40, description="onnxruntime's version")
    ] = None,
    cpu: Annotated[str | None, Query(max_length=200, description="The CPU model")] = None,
    since: Annotated[
        str | None,
        Query(
            max_length=64,
            description="Measured at or after this time (ISO 8601; without an offset: UTC)",
            json_schema_extra={"format": "date-time"},
        ),
    ] = None,
    source: Annotated[
        Literal["measured", "imported"] | None,
        Query(description="measured by a job here, or imported"),
    ] = None,
) -> verdicts.VerdictFilters:
    return verdicts.VerdictFilters(
        pattern, verdict, signature, machine_key, onnxruntime, cpu, _time(since), source
    )


def _time(text: str | None) -> datetime | None:
    """An ISO 8601 time; a number (which pydantic would read as seconds since the epoch)
    or anything else is refused, as the published date-time format says."""
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise ProblemError(
            422,
            "invalid-request",
            "Invalid request",
            f"since: {text!r} is not an ISO 8601 time; send e.g. 2026-12-01T00:00:00Z",
        ) from None


FiltersDep = Annotated[verdicts.VerdictFilters, Depends(_filters)]
_INT_MAX = 2**31 - 1


@router.get(
    "",
    response_model=VerdictsPublic,
    operation_id="listVerdicts",
    responses=problem_responses(400, 401, 422),
)
def read_verdicts(
    principal: PrincipalDep,
    session: SessionDep,
    settings: SettingsDep,
    filters: FiltersDep,
    page_size: Annotated[
        int | None,
        Query(
            ge=0,
            le=_INT_MAX,
            description=f"Verdicts per page: 0 or absent {PAGE_SIZE_DEFAULT}, "
            f"at most {PAGE_SIZE_MAX} (larger values are clamped)",
        ),
    ] = None,
    page_token: Annotated[
        str | None, Query(max_length=1000, description="The next_page_token of the previous page")
    ] = None,
) -> VerdictsPublic:
    """List the verdict store, newest measurement first, a page at a time."""
    page = retry_stale(
        session,
        lambda s: list_verdicts(
            s,
            filters,
            page_size,
            page_token,
            principal.tenant_id,
            shared=settings.verdicts_shared,
        ),
    )
    return VerdictsPublic.model_validate(page, from_attributes=True)


@router.get(
    "/export",
    response_class=JSONResponse,
    operation_id="exportVerdicts",
    responses={
        200: {
            "description": "A verdicts file (autofusion verdicts import reads it)",
            "content": {
                "application/json": {"schema": {"$ref": "#/components/schemas/VerdictsFile"}}
            },
            "headers": {
                "Content-Disposition": {
                    "description": 'attachment; filename="verdicts.json"',
                    "schema": {"type": "string"},
                }
            },
        },
        **problem_responses(401, 422),
    },
)
def export_verdicts(
    principal: PrincipalDep,
    session: SessionDep,
    settings: SettingsDep,
    filters: FiltersDep,
    limit: Annotated[
        int,
        Query(
            ge=0,
            le=verdicts.EXPORT_LIMIT,
            description="The newest this many of the filtered verdicts",
        ),
    ] = verdicts.EXPORT_LIMIT,
) -> JSONResponse:
    """The filtered verdicts (the newest, up to limit) as a verdicts file, to download."""
    document = verdicts.export_verdicts(
        session,
        filters,
        viewer_tenant=principal.tenant_id,
        shared=settings.verdicts_shared,
        limit=limit,
    )
    disposition = 'attachment; filename="verdicts.json"'
    return JSONResponse(document, headers={"Content-Disposition": disposition})


@router.post(
    "/import",
    response_model=VerdictsImported,
    operation_id="importVerdicts",
    responses=problem_responses(422),
)
def import_verdicts(
    body: VerdictsFile, principal: AdminDep, session: SessionDep
) -> VerdictsImported:
    """Store the verdicts of a verdicts file (an export of a trusted server)."""
    records, skipped = verdicts.parse_verdicts_file(body.model_dump())
    counts = verdicts.import_verdicts(session, records, principal.tenant_id)
    session.commit()
    return VerdictsImported(
        imported=counts.imported, duplicates=counts.duplicates, skipped=skipped + counts.skipped
    )
