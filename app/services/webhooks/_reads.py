"""Reading the webhook state back: a job's callback and delivery log, a tenant's settings."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.models import Job, JobWebhook, TenantWebhook, WebhookDelivery
from autofusion.app.services.webhooks._records import JobWebhooksPublic, TenantWebhookPublic
from autofusion.app.services.webhooks._tenants import signing_secret

__all__ = ["job_webhooks", "tenant_settings"]


def job_webhooks(session: Session, job: Job, public_url: str | None = None) -> JobWebhooksPublic:
    """The job's callback and every attempt so far, oldest first (``public_url``: the
    server's, which the message's links start with when set)."""
    callback = session.get(JobWebhook, job.id)
    deliveries = session.scalars(
        select(WebhookDelivery)
        .where(WebhookDelivery.job_id == job.id)
        .order_by(WebhookDelivery.attempt, WebhookDelivery.id)
    ).all()
    return JobWebhooksPublic.from_rows(callback, list(deliveries), public_url)


def tenant_settings(session: Session, tenant_id: str, settings: Settings) -> TenantWebhookPublic:
    """The tenant's settings; its secret is made here when it has none and the server
    has no secret of its own (the caller commits)."""
    secret = signing_secret(session, tenant_id, settings)
    row = session.get(TenantWebhook, tenant_id)
    return TenantWebhookPublic(
        default_url=row.default_url if row is not None else None,
        secret=secret.value if secret.source == "tenant" else None,
        signed_with=secret.source,
        allowed_hosts=list(settings.webhook_allowed_hosts),
    )
