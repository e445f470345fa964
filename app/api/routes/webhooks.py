"""Routes: webhooks. A job's callback and its delivery log; the tenant's settings (its
default callback URL, its signing secret and the secret's rotation)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends

from autofusion.app.api.deps import PrincipalDep, SessionDep, SettingsDep, require_scope
from autofusion.app.api.problems import problem_responses
from autofusion.app.api.schemas.webhooks import (
    JobWebhooksPublic,
    TenantWebhookPublic,
    TenantWebhookUpdate,
)
from autofusion.app.services import webhooks
from autofusion.app.services.auth import Principal
from autofusion.app.services.jobs import get_job

__all__ = ["router"]

router = APIRouter(tags=["webhooks"])

# The settings hold the signing secret: a key that may submit jobs may read them.
WriterDep = Annotated[Principal, Depends(require_scope("jobs:write"))]


@router.get(
    "/v1/jobs/{job_id}/webhooks",
    response_model=JobWebhooksPublic,
    responses=problem_responses(401, 404, 422),
    operation_id="listJobWebhooks",
)
def read_job_webhooks(
    job_id: str, principal: PrincipalDep, session: SessionDep, settings: SettingsDep
) -> JobWebhooksPublic:
    """The job's callback and every delivery attempt so far (the delivery log)."""
    job = get_job(session, principal.tenant_id, job_id)
    return webhooks.job_webhooks(session, job, settings.public_url)


@router.get(
    "/v1/webhooks",
    response_model=TenantWebhookPublic,
    responses=problem_responses(401, 403),
    operation_id="getWebhookSettings",
)
def read_settings(
    principal: WriterDep, session: SessionDep, settings: SettingsDep
) -> TenantWebhookPublic:
    """This tenant's default callback URL and the secret its webhooks are signed with."""
    public = webhooks.tenant_settings(session, principal.tenant_id, settings)
    session.commit()  # a secret made on this first read
    return public


@router.put(
    "/v1/webhooks",
    response_model=TenantWebhookPublic,
    responses=problem_responses(401, 403, 408, 413, 422),
    operation_id="updateWebhookSettings",
)
def update_settings(
    body: TenantWebhookUpdate, principal: WriterDep, session: SessionDep, settings: SettingsDep
) -> TenantWebhookPublic:
    """Set (or, with null, clear) the callback URL of this tenant's jobs that name none."""
    webhooks.check_callback_url(body.default_url, settings, "default_url", in_config=False)
    webhooks.set_default_url(session, principal.tenant_id, body.default_url)
    public = webhooks.tenant_settings(session, principal.tenant_id, settings)
    session.commit()
    return public


@router.post(
    "/v1/webhooks/secret",
    response_model=TenantWebhookPublic,
    responses=problem_responses(401, 403),
    operation_id="rotateWebhookSecret",
)
def rotate_secret(
    principal: WriterDep, session: SessionDep, settings: SettingsDep
) -> TenantWebhookPublic:
    """Make a new signing secret for this tenant; the old one stops signing at once."""
    webhooks.rotate_secret(session, principal.tenant_id)
    public = webhooks.tenant_settings(session, principal.tenant_id, settings)
    session.commit()
    return public
