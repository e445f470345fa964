"""Routes: optimization jobs. ``POST /v1/optimize`` creates one; the rest follow it.

Every job route answers 404 for another tenant's job, exactly as for a missing one.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Query, Request, Response
from fastapi.responses import StreamingResponse
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from autofusion.app.api.deps import PrincipalDep, SessionDep, SettingsDep, StoreDep, require_scope
from autofusion.app.api.downloads import JobDownloads, etag_matches
from autofusion.app.api.openapi_bodies import (
    binary_part,
    data_upload_part,
    inline_refs,
    multipart_body,
)
from autofusion.app.api.problems import problem_responses
from autofusion.app.api.schemas.jobs import JobPublic, JobsPublic, OptimizeOptions
from autofusion.app.api.uploads import incoming
from autofusion.app.core.config import Settings
from autofusion.app.core.db import autocommit_read, retry_stale, session_factory
from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import JobStatus
from autofusion.app.services import job_files
from autofusion.app.services.auth import Principal
from autofusion.app.services.events import job_events
from autofusion.app.services.idempotency import key_in_use, release_key, reserve_key
from autofusion.app.services.job_pages import (
    PAGE_SIZE_DEFAULT,
    PAGE_SIZE_MAX,
    decode_page_token,
    encode_page_token,
    list_jobs,
    page_size_of,
)
from autofusion.app.services.jobs import cancel_job, get_job
from autofusion.app.services.quotas import Quotas, check_before_upload
from autofusion.app.services.retention import delete_job
from autofusion.app.services.uploads import StoredUpload, accept_upload, create_job_for_upload
from autofusion.app.services.worker_health import job_with_waiting

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(tags=["jobs"])

WriterDep = Annotated[Principal, Depends(require_scope("jobs:write"))]


def _optimize_body() -> dict[str, Any]:
    """The multipart body, for OpenAPI: the route reads it as a stream, not as Form()."""
    config_schema = inline_refs(OptimizeOptions.model_json_schema())
    return multipart_body(
        {
            "model": binary_part("The ONNX model (its file name is kept)."),
            "data": {
                "type": "array",
                "items": {"type": "string", "format": "binary"},
                "description": "External-data files, named as the model's "
                "external-data locations name them (plain file names).",
            },
            "data_upload": data_upload_part(),
            "config": {
                "type": "string",
                "contentMediaType": "application/json",
                "contentSchema": config_schema,
                "description": "Options as JSON (OptimizeOptions).",
            },
        },
        encoding={"config": {"contentType": "application/json"}},
    )


def _job_headers(response: Response, job: JobPublic, retry_after_s: int) -> None:
    response.headers["ETag"] = job.etag
    response.headers["Cache-Control"] = "no-cache"
    if not job.status.is_final:
        response.headers["Retry-After"] = str(retry_after_s)


@router.post(
    "/v1/optimize",
    status_code=202,
    operation_id="optimize",
    response_model=JobPublic,
    openapi_extra=_optimize_body(),
    # 503: a big model's check waited api_sandbox_queue_s for a free model child.
    # 409: a request with the same Idempotency-Key is still being received.
    # 429: too many uploads at once, or too many queued jobs; 507: the tenant's stored
    # bytes (app/services/quotas.py).
    responses=problem_responses(401, 403, 408, 409, 413, 415, 422, 429, 503, 507),
)
async def optimize(
    request: Request,
    response: Response,
    principal: WriterDep,
    settings: SettingsDep,
    store: StoreDep,
    idempotency_key: Annotated[str | None, Header(min_length=1, max_length=200)] = None,
) -> JobPublic:
    """Upload a model (and its external data) and queue a job to optimize it."""
    # No request session: the body streams to disk holding no database connection
    # (issue 15: ten slow uploads held all of them); the job is written afterwards.
    # The key is reserved before the body is read: a second request with it meanwhile
    # is a 409 (app/services/idempotency.py), not a second upload racing the first.
    token = None
    if idempotency_key:
        token = await run_in_threadpool(_reserve, settings, principal, idempotency_key)
    try:
        # The quotas, before a byte of the body is read; checked again with the insert.
        length = request.headers.get("content-length")
        await run_in_threadpool(_check_quotas, settings, principal, length, idempotency_key)
        stored = await accept_upload(
            incoming(request, settings), settings, store, tenant=principal.tenant_id
        )
        public, created = await run_in_threadpool(
            _create_job, settings, principal, stored, idempotency_key, str(request.base_url)
        )
    finally:
        if token is not None:
            await run_in_threadpool(_release, settings, principal, idempotency_key, token)
    if created:
        _enqueue(request, public.id)
    _job_headers(response, public, settings.retry_after_s)
    response.headers["Location"] = public.links.self
    response.headers["Retry-After"] = str(settings.retry_after_s)
    if not created:
        response.headers["Idempotent-Replayed"] = "true"
    return public


def _create_job(
    settings: Settings,
    principal: Principal,
    stored: StoredUpload,
    idempotency_key: str | None,
    base_url: str,
) -> tuple[JobPublic, bool]:
    """The job row, in a session of its own held only for this write."""
    with session_factory(settings.resolved_database_url)() as session:
        job, created = create_job_for_upload(
            session,
            principal,
            stored,
            idempotency_key=idempotency_key,
            max_attempts=settings.max_attempts,
            quotas=Quotas.from_settings(settings),
            key_ttl_s=settings.idempotency_key_ttl_s,
            base_url=base_url,
        )
        return JobPublic.from_job(job), created


def _check_quotas(
    settings: Settings, principal: Principal, length: str | None, key: str | None
) -> None:
    with session_factory(settings.resolved_database_url)() as session:
        quotas = Quotas.from_settings(settings)
        check_before_upload(
            session, quotas, principal.tenant_id, length, key, settings.idempotency_key_ttl_s
        )


def _reservation_stale_s(settings: Settings) -> float:
    """The longest a request can take (the upload, then its checks), and a minute more:
    a reservation older than that belongs to an API process that was killed."""
    return (
        settings.body_total_timeout_s
        + settings.api_sandbox_queue_s
        + settings.api_sandbox_time_limit_s
        + 60
    )


def _reserve(settings: Settings, principal: Principal, key: str) -> str | None:
    with session_factory(settings.resolved_database_url)() as session:
        try:
            token = reserve_key(
                session,
                principal.tenant_id,
                key,
                stale_s=_reservation_stale_s(settings),
                retry_after_s=settings.retry_after_s,
                ttl_s=settings.idempotency_key_ttl_s,
            )
            session.commit()
        except IntegrityError:  # reserved by a request of the same moment
            session.rollback()
            raise key_in_use(key, settings.retry_after_s) from None
        return token


def _release(settings: Settings, principal: Principal, key: str, token: str) -> None:
    try:
        with session_factory(settings.resolved_database_url)() as session:
            release_key(session, principal.tenant_id, key, token)
            session.commit()
    except Exception:  # the answer stands; a left reservation goes stale and is taken over
        logger.exception("could not remove the reservation of Idempotency-Key %r", key)


def _enqueue(request: Request, job_id: str) -> None:
    # The row is committed: a lost message only delays the job (the reaper re-sends it).
    try:
        request.app.state.enqueue(job_id)
    except Exception:
        logger.exception("could not enqueue job %s; the reaper will send it again", job_id)


# Integers a client sends stay below what every database column here holds.
_INT_MAX = 2**31 - 1
PageSize = Annotated[
    int | None,
    Query(
        ge=0,
        le=_INT_MAX,
        description=f"Jobs per page: 0 or absent {PAGE_SIZE_DEFAULT}, "
        f"at most {PAGE_SIZE_MAX} (larger values are clamped)",
    ),
]
PageToken = Annotated[
    str | None, Query(max_length=1000, description="The next_page_token of the previous page")
]
# Deprecated (before page tokens): limit is page_size; offset skips rows, and its pages
# shift when jobs are submitted between two reads.
Limit = Annotated[int | None, Query(ge=0, le=_INT_MAX, deprecated=True, description="page_size")]
Offset = Annotated[
    int | None,
    Query(ge=0, le=_INT_MAX, deprecated=True, description="Rows to skip: use page_token"),
]


@router.get(
    "/v1/jobs",
    response_model=JobsPublic,
    operation_id="listJobs",
    responses=problem_responses(400, 401, 422),
)
def read_jobs(
    principal: PrincipalDep,
    session: SessionDep,
    status: JobStatus | None = None,
    page_size: PageSize = None,
    page_token: PageToken = None,
    limit: Limit = None,
    offset: Offset = None,
) -> JobsPublic:
    """List this tenant's jobs, newest first, a page at a time."""
    status_value = status.value if status is not None else None
    if page_token is not None and offset:
        raise ProblemError(
            422,
            "invalid-request",
            "Invalid request",
            "page_token and offset cannot be combined: page with page_token alone",
        )
    key = decode_page_token(page_token, status_value) if page_token else None
    size = page_size_of(page_size if page_size is not None else limit)
    page = retry_stale(
        session,
        lambda s: list_jobs(
            s, principal.tenant_id, status=status_value, page_size=size, key=key, offset=offset
        ),
    )
    token = encode_page_token(page.older, status_value) if page.older else None
    items = [JobPublic.from_job(job) for job in page.jobs]
    return JobsPublic(items=items, total=page.total, page_size=size, next_page_token=token)


_etag_matches = etag_matches  # If-None-Match: the same rule as the downloads'


@router.get(
    "/v1/jobs/{job_id}",
    response_model=JobPublic,
    operation_id="getJob",
    responses={304: {"description": "Not modified"}, **problem_responses(401, 404, 422)},
)
async def read_job(
    job_id: str,
    response: Response,
    principal: PrincipalDep,
    session: SessionDep,
    settings: SettingsDep,
    if_none_match: Annotated[str | None, Header()] = None,
) -> Any:
    """One job; send its ETag in If-None-Match to poll cheaply (304 while unchanged)."""
    public = await run_in_threadpool(_read_job, session, principal.tenant_id, job_id, settings)
    if _etag_matches(if_none_match, public.etag):
        not_modified = Response(status_code=304)
        _job_headers(not_modified, public, settings.retry_after_s)
        return not_modified
    _job_headers(response, public, settings.retry_after_s)
    return public


def _read_job(session: Session, tenant_id: str, job_id: str, settings: Settings) -> JobPublic:
    """A poll is one round trip: the key came from the cache (app/services/auth.py), the
    connection is not pinged (app/core/db.py) and the read needs no transaction around it;
    a queued job's waiting reason comes in the same statement."""

    def read(s: Session) -> JobPublic:
        job, waiting = job_with_waiting(autocommit_read(s), tenant_id, job_id, settings)
        return JobPublic.from_job(job, waiting=waiting)

    return retry_stale(session, read)


@router.post(
    "/v1/jobs/{job_id}/cancel",
    status_code=202,
    operation_id="cancelJob",
    response_model=JobPublic,
    responses=problem_responses(401, 403, 404, 409, 422),
)
def cancel(job_id: str, response: Response, principal: WriterDep, session: SessionDep) -> JobPublic:
    """Cancel a job: at once if queued, at the worker's next progress report if running."""
    job = cancel_job(session, get_job(session, principal.tenant_id, job_id))
    session.commit()
    public = JobPublic.from_job(job)
    response.headers["ETag"] = public.etag
    return public


@router.delete(
    "/v1/jobs/{job_id}",
    status_code=204,
    operation_id="deleteJob",
    response_class=Response,
    responses=problem_responses(401, 403, 404, 409, 422),
)
def delete(job_id: str, principal: WriterDep, session: SessionDep) -> Response:
    """Delete a job that is not running, and its files: frees the tenant's quota."""
    delete_job(session, get_job(session, principal.tenant_id, job_id))
    session.commit()
    return Response(status_code=204)


@router.get(
    "/v1/jobs/{job_id}/events",
    response_class=StreamingResponse,
    operation_id="followJob",
    responses={
        200: {"content": {"text/event-stream": {}}, "description": "Server-sent events"},
        **problem_responses(401, 404, 422),
    },
)
def events(
    job_id: str,
    request: Request,
    principal: PrincipalDep,
    session: SessionDep,
    settings: SettingsDep,
    last_event_id: Annotated[str | None, Header()] = None,
) -> StreamingResponse:
    """Follow a job: `progress` on each change, then `done` when it ends; then the stream closes."""
    get_job(session, principal.tenant_id, job_id)
    # An id this server sent is a revision: ASCII digits ("²" passes isdigit(), not int()).
    digits = last_event_id is not None and last_event_id.isascii() and last_event_id.isdigit()
    last = int(last_event_id) if digits and len(last_event_id) <= 18 else None
    stream = job_events(
        settings.resolved_database_url,
        principal.tenant_id,
        job_id,
        poll_s=settings.events_poll_s,
        last_revision=last,
        is_disconnected=request.is_disconnected,
    )
    return StreamingResponse(
        stream,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# The downloads: GET and HEAD each (HEAD: the same headers, no body, nothing fetched).
# Every answer carries the file's strong ETag and Repr-Digest (app/api/downloads.py).
_DOWNLOAD_PROBLEMS = problem_responses(401, 404, 409, 422)
_NOT_MODIFIED = {304: {"description": "Not modified: If-None-Match holds the ETag"}}


def _download_route(
    path: str,
    content: dict[str, Any],
    description: str,
    problems: tuple[int, ...] = (),
    *,
    name: str,
):
    """Register a download endpoint for GET (the file, operation ``download<name>``) and
    HEAD (its headers, operation ``head<name>``)."""

    def register(endpoint):
        responses = {**_NOT_MODIFIED, **_DOWNLOAD_PROBLEMS, **problem_responses(*problems)}
        router.get(
            path,
            response_class=Response,
            operation_id=f"download{name}",
            responses={200: {"content": content, "description": description}, **responses},
        )(endpoint)
        router.head(
            path,
            response_class=Response,
            operation_id=f"head{name}",
            responses={200: {"description": f"{description}: its headers, no body"}, **responses},
        )(endpoint)
        return endpoint

    return register


def _download(
    request: Request,
    principal: PrincipalDep,
    session: SessionDep,
    settings: SettingsDep,
    store: StoreDep,
) -> JobDownloads:
    return JobDownloads(request, principal, session, settings, store)


DownloadDep = Annotated[JobDownloads, Depends(_download)]


@_download_route(
    "/v1/jobs/{job_id}/model",
    {"application/octet-stream": {}},
    "The fused model",
    problems=(400, 416),  # a Range refused (the model answers Range requests)
    name="JobModel",
)
def download_model(job_id: str, download: DownloadDep) -> Response:
    """The fused model (only once the job has succeeded)."""
    return download.send(job_files.fused_model_file(download.job(job_id)))


@_download_route(
    "/v1/jobs/{job_id}/model/data/{name}",
    {"application/octet-stream": {}},
    "One of the fused model's external-data files",
    problems=(400, 416),  # a Range refused (data files answer Range requests)
    name="JobModelData",
)
def download_model_data(job_id: str, name: str, download: DownloadDep) -> Response:
    """One of the fused model's data files, by the name its external-data entries give
    (the job's ``links.model_data`` lists them): a model whose weights went to a data file
    (it came with one, or it is over 2 GB) is the model file and these, saved side by side
    under these names. They answer Range requests: an interrupted download resumes."""
    return download.send(job_files.fused_data_file(download.job(job_id), name))


@_download_route(
    "/v1/jobs/{job_id}/report",
    {"application/json": {"schema": {"type": "object"}}},
    "The report (docs/report.schema.json)",
    name="JobReport",
)
def download_report(job_id: str, download: DownloadDep) -> Response:
    """The job's JSON report (once it has finished with one)."""
    return download.send(job_files.report_file(download.job(job_id)))


@_download_route(
    "/v1/jobs/{job_id}/artifacts/{name}",
    {media: {} for media in job_files.ARTIFACT_TYPES.values()},
    "report.html (self-contained, charts and region pictures), report.md, or "
    "profile_trace.json (onnxruntime's profiler trace of the fused model, when the job "
    "profiled)",
    name="JobArtifact",
)
def download_artifact(job_id: str, name: str, download: DownloadDep) -> Response:
    """One of the job's stored files besides the model and report.json."""
    job_files.check_artifact_name(name)
    return download.send(job_files.artifact_file(download.job(job_id), name))
