"""Dashboard: submit a model. The upload takes the API's path: the same streaming
receiver and size limit, the same model checks, the same job creation and enqueueing
as ``POST /v1/optimize``; only the options come from form fields, not a JSON part."""

from __future__ import annotations

import json
import logging
from typing import get_args

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse
from starlette.concurrency import run_in_threadpool

from autofusion.app.api.deps import SessionDep, SettingsDep, StoreDep
from autofusion.app.api.uploads import incoming
from autofusion.app.core.db import session_factory
from autofusion.app.core.errors import ProblemError
from autofusion.app.services.quotas import Quotas, check_before_upload
from autofusion.app.services.strategies import list_strategies
from autofusion.app.services.uploads import (
    Upload,
    accept_received,
    check_file_name,
    create_job_for_upload,
    receive_upload,
    remove_folder,
)
from autofusion.app.ui.common import UIPrincipal, form_errors, render, require
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.errors import FusionError

__all__ = ["router"]

logger = logging.getLogger(__name__)

router = APIRouter(prefix="/ui/submit", include_in_schema=False)

TARGETS = list(get_args(OptimizeConfig.model_fields["target"].annotation))
FORM_FIELDS = frozenset({"target", "strategy", "model_name", "profile", "measure"})
# Where an error of the upload shows: next to the field it is about.
_FIELD_OF = {"config.target": "target", "config.strategy": "strategy", "config": "model"}


def _form(request: Request, session: SessionDep, values: dict, errors: list, status: int = 200):
    limit = request.app.state.settings.max_upload_bytes  # the form's body, data files too
    context = {
        "targets": TARGETS,
        "strategies": [s.name for s in list_strategies(session)],
        "values": values,
        "errors": errors,
        "upload_limit": f"{limit / 2**30:g} GiB" if limit >= 2**30 else f"{limit >> 20} MiB",
    }
    return render(request, "submit.html", context, status_code=status)


@router.get("")
def submit_page(request: Request, principal: UIPrincipal, session: SessionDep):
    """The upload form."""
    return _form(request, session, {"target": ""}, [])


def _apply_fields(upload: Upload) -> None:
    """The form fields as the API's ``config`` part, and the model's name if given."""
    fields = upload.fields
    config: dict = {}
    if fields.get("target"):
        config["target"] = fields["target"]
    if fields.get("strategy"):
        config["strategy"] = fields["strategy"]
    if "profile" in fields:
        config["profile"] = True
    if "measure" in fields:
        config["measure"] = True
    upload.config_text = json.dumps(config)
    name = fields.get("model_name", "").strip()
    if name and name != upload.model_name:
        check_file_name(name, "model_name")
        upload.model_path.rename(upload.folder / name)
        upload.model_name = name


@router.post("")
async def submit(
    request: Request,
    principal: UIPrincipal,
    settings: SettingsDep,
    store: StoreDep,
):
    """Upload, check and store the model, create and enqueue the job, then show it."""
    # No request session while the body streams (as POST /v1/optimize): each write
    # below takes a session of its own for its moment.
    require(principal, "jobs:write")
    values: dict = {"target": ""}
    try:
        # The tenant's quotas, before the body streams (as POST /v1/optimize).
        length = request.headers.get("content-length")
        await run_in_threadpool(_check_quotas, settings, principal, length)
        body = incoming(request, settings)
        upload = await receive_upload(
            body, settings, text_fields=FORM_FIELDS, tenant=principal.tenant_id
        )
        values = {
            **upload.fields,
            "profile": "profile" in upload.fields,
            "measure": "measure" in upload.fields,
        }
        try:
            _apply_fields(upload)
        except BaseException:
            remove_folder(upload.folder)
            raise
        stored = await accept_received(upload, settings, store)
        base_url = str(request.base_url)  # the webhook's links start here (no public_url)
        job_id, created = await run_in_threadpool(
            _create_job, settings, principal, stored, base_url
        )
    except (ProblemError, FusionError) as exc:
        status, errors = form_errors(exc, "model")
        for error in errors:
            error["field"] = _FIELD_OF.get(error["field"], error["field"])
        return await run_in_threadpool(_error_form, request, settings, values, errors, status)
    if created:
        try:  # the row is committed: a lost message only delays the job (the reaper)
            request.app.state.enqueue(job_id)
        except Exception:
            logger.exception("could not enqueue job %s; the reaper will send it again", job_id)
    return RedirectResponse(f"/ui/jobs/{job_id}", status_code=303)


def _check_quotas(settings, principal, length: str | None) -> None:
    with session_factory(settings.resolved_database_url)() as session:
        quotas = Quotas.from_settings(settings)
        check_before_upload(session, quotas, principal.tenant_id, length)


def _create_job(settings, principal, stored, base_url: str) -> tuple[str, bool]:
    with session_factory(settings.resolved_database_url)() as session:
        job, created = create_job_for_upload(
            session,
            principal,
            stored,
            idempotency_key=None,
            max_attempts=settings.max_attempts,
            quotas=Quotas.from_settings(settings),
            base_url=base_url,
        )
        return job.id, created


def _error_form(request: Request, settings, values: dict, errors: list, status: int):
    with session_factory(settings.resolved_database_url)() as session:
        return _form(request, session, values, errors, status)
