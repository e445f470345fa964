"""Routes: data uploads, one big external-data file each, sent in resumable parts (the
shape of the IETF resumable uploads draft, tus, kept simple). ``POST /v1/optimize``
names a complete one with a ``data_upload`` field.

Every route answers 404 for another tenant's upload, exactly as for a missing one, and
``Cache-Control: no-store``: an upload's offset is only true now.
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Header, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from autofusion.app.api.deps import (
    PrincipalDep,
    SessionDep,
    SettingsDep,
    StoreDep,
    require_scope,
)
from autofusion.app.api.openapi_bodies import octet_body
from autofusion.app.api.problems import problem_responses
from autofusion.app.api.uploads import incoming
from autofusion.app.services.auth import Principal
from autofusion.app.services.uploads import (
    OFFSET_MEDIA_TYPE,
    DataUploadCreate,
    DataUploadPublic,
    create_data_upload,
    delete_data_upload,
    get_data_upload,
    public_view,
    receive_part,
)

__all__ = ["router"]

router = APIRouter(tags=["uploads"])

# Writing takes the scope of the job its file is for; any key of the tenant reads.
WriterDep = Annotated[Principal, Depends(require_scope("jobs:write"))]
UploadOffset = Annotated[
    int,
    Header(
        ge=0,
        le=2**63 - 1,
        description="Where this PATCH's bytes start: the upload's received bytes (HEAD says it).",
    ),
]

_NO_STORE = {"Cache-Control": "no-store"}


def _header(description: str, integer: bool = False) -> dict[str, Any]:
    schema = {"type": "integer", "minimum": 0} if integer else {"type": "string"}
    return {"description": description, "schema": schema, "required": True}


_OFFSET = _header("The bytes of the file the upload has received.", integer=True)
_LENGTH = _header("The file's size in bytes, as declared.", integer=True)
_CACHE = _header("no-store: an upload's offset is only true now.")


def _with_headers(responses: dict[int | str, Any], **headers: dict[int, Any]) -> dict:
    """``responses`` with response headers added per status (``headers[name] = {status:
    header object}``)."""
    for name, by_status in headers.items():
        for status, header in by_status.items():
            responses.setdefault(status, {}).setdefault("headers", {})[name] = header
    return responses


def _no_store(response: Response) -> None:
    response.headers.update(_NO_STORE)


@router.post(
    "/v1/uploads",
    status_code=201,
    response_model=DataUploadPublic,
    operation_id="createUpload",
    # 413: the size passes max_data_file_bytes; 429: too many open uploads; 507: the
    # tenant's stored bytes (app/services/quotas.py).
    responses=_with_headers(
        {
            200: {
                "description": "This tenant's upload of the same file (name, size, sha256) "
                "that is still receiving or complete: resume it from `received`",
                "model": DataUploadPublic,
            },
            **problem_responses(401, 403, 413, 422, 429, 507),
        },
        Location={
            200: _header("The upload's path, for its PATCHes."),
            201: _header("The upload's path, for its PATCHes."),
        },
        **{"Cache-Control": {200: _CACHE, 201: _CACHE}},
    ),
)
def create_upload(
    body: DataUploadCreate,
    response: Response,
    principal: WriterDep,
    session: SessionDep,
    settings: SettingsDep,
) -> DataUploadPublic:
    """Start a resumable upload of one data file; its bytes follow in PATCHes."""
    public, created = create_data_upload(session, principal.tenant_id, body, settings)
    session.commit()
    if not created:  # the same file, started before: resume it (HEAD or received)
        response.status_code = 200
    response.headers["Location"] = public.links.self
    _no_store(response)
    return public


@router.patch(
    "/v1/uploads/{upload_id}",
    response_model=DataUploadPublic,
    operation_id="writeUpload",
    openapi_extra=octet_body(OFFSET_MEDIA_TYPE, "The file's bytes from Upload-Offset on."),
    responses=_with_headers(
        {
            200: {"description": "The last bytes: the file is checked, stored and complete."},
            204: {"description": "The bytes are kept; more are due."},
            **problem_responses(400, 401, 403, 404, 409, 413, 415, 422, 429),
        },
        **{"Upload-Offset": {200: _OFFSET, 204: _OFFSET, 409: _OFFSET}},
        **{"Cache-Control": {200: _CACHE, 204: _CACHE}},
    ),
)
async def write_upload(
    upload_id: str,
    request: Request,
    principal: WriterDep,
    settings: SettingsDep,
    store: StoreDep,
    upload_offset: UploadOffset,
) -> Response:
    """Send the file's bytes from Upload-Offset on; resume from HEAD's offset."""
    public = await receive_part(
        incoming(request, settings),
        settings,
        store,
        tenant_id=principal.tenant_id,
        upload_id=upload_id,
        offset=upload_offset,
    )
    headers = {"Upload-Offset": str(public.received), **_NO_STORE}
    if public.status == "complete":
        return JSONResponse(public.model_dump(mode="json"), headers=headers)
    return Response(status_code=204, headers=headers)


@router.head(
    "/v1/uploads/{upload_id}",
    operation_id="headUpload",
    response_class=Response,
    responses=_with_headers(
        {200: {"description": "No body: the offset and length are the headers."}}
        | problem_responses(401, 404),
        **{"Upload-Offset": {200: _OFFSET}, "Upload-Length": {200: _LENGTH}},
        **{"Cache-Control": {200: _CACHE}},
    ),
)
def head_upload(upload_id: str, principal: PrincipalDep, session: SessionDep) -> Response:
    """Where the upload stands: Upload-Offset (received) and Upload-Length (size)."""
    row = get_data_upload(session, principal.tenant_id, upload_id)
    headers = {"Upload-Offset": str(row.received), "Upload-Length": str(row.size)}
    return Response(status_code=200, headers={**headers, **_NO_STORE})


@router.get(
    "/v1/uploads/{upload_id}",
    response_model=DataUploadPublic,
    operation_id="getUpload",
    responses=_with_headers(problem_responses(401, 404), **{"Cache-Control": {200: _CACHE}}),
)
def read_upload(
    upload_id: str, response: Response, principal: PrincipalDep, session: SessionDep
) -> DataUploadPublic:
    """The upload: its received bytes, status and, once complete, the file's digest."""
    public = public_view(get_data_upload(session, principal.tenant_id, upload_id))
    _no_store(response)
    return public


@router.delete(
    "/v1/uploads/{upload_id}",
    status_code=204,
    operation_id="deleteUpload",
    response_class=Response,
    responses=problem_responses(401, 403, 404),
)
async def remove_upload(
    upload_id: str, principal: WriterDep, settings: SettingsDep, store: StoreDep
) -> Response:
    """Delete the upload and the bytes it holds (jobs that use its file keep it)."""
    await run_in_threadpool(delete_data_upload, settings, store, principal.tenant_id, upload_id)
    return Response(status_code=204, headers=_NO_STORE)
