"""A tenant's webhook settings: its signing secret and its default callback URL.

Which secret signs a tenant's webhooks: its own, once it has one; otherwise the
server-wide ``webhook_secret`` when the operator set it (a keyless server's one
tenant); otherwise one made for the tenant on first need (its first delivery, or its
first read of ``GET /v1/webhooks``), which the tenant reads back and may rotate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy.orm import Session

from autofusion.app.core.config import Settings
from autofusion.app.core.models import Job, JobWebhook, TenantWebhook, utcnow
from autofusion.app.core.webhook_secrets import new_webhook_secret
from autofusion.app.services.auth import ensure_tenant
from autofusion.app.services.quotas import lock_tenant

__all__ = [
    "SigningSecret",
    "attach_callback",
    "rotate_secret",
    "set_default_url",
    "signing_secret",
    "tenant_webhook",
]


@dataclass(frozen=True)
class SigningSecret:
    value: str  # whsec_...
    source: Literal["tenant", "server"]


def tenant_webhook(session: Session, tenant_id: str) -> TenantWebhook:
    """The tenant's row, made (empty) when it has none, for a change. The tenant's row
    is locked first: of two first uses at once (two workers delivering, a request), the
    second waits for the first's commit and finds its row (PostgreSQL; SQLite's writers
    take turns anyway)."""
    ensure_tenant(session, tenant_id)
    lock_tenant(session, tenant_id)
    row = session.get(TenantWebhook, tenant_id, populate_existing=True)
    if row is None:
        row = TenantWebhook(tenant_id=tenant_id)
        session.add(row)
        session.flush()
    return row


def signing_secret(session: Session, tenant_id: str, settings: Settings) -> SigningSecret:
    """The secret that signs this tenant's webhooks (see the module's docstring); one
    made here is flushed, the caller commits."""
    row = session.get(TenantWebhook, tenant_id)
    if row is not None and row.secret:
        return SigningSecret(row.secret, "tenant")
    if settings.webhook_secret is not None:
        return SigningSecret(settings.webhook_secret.get_secret_value(), "server")
    row = tenant_webhook(session, tenant_id)
    if not row.secret:  # else made meanwhile by whoever held the lock before
        row.secret, row.updated_at = new_webhook_secret(), utcnow()
        session.flush()
    return SigningSecret(row.secret, "tenant")


def rotate_secret(session: Session, tenant_id: str) -> str:
    """A new secret for the tenant (its first, or one that replaces the old at once)."""
    row = tenant_webhook(session, tenant_id)
    row.secret, row.updated_at = new_webhook_secret(), utcnow()
    session.flush()
    return row.secret


def set_default_url(session: Session, tenant_id: str, url: str | None) -> TenantWebhook:
    """The callback URL of the tenant's jobs that name none (None: no default). The
    caller has checked it (``check_callback_url``)."""
    row = tenant_webhook(session, tenant_id)
    row.default_url, row.updated_at = url, utcnow()
    session.flush()
    return row


def attach_callback(
    session: Session, job: Job, url: str | None, *, base_url: str | None = None
) -> JobWebhook | None:
    """The job's callback: ``url`` (checked by the caller), or its tenant's default;
    None when neither is set. It waits for the job to end. ``base_url``: the address
    the job was submitted to (the request's), kept for the message's absolute links."""
    if url is None:
        row = session.get(TenantWebhook, job.tenant_id)
        url = row.default_url if row is not None else None
    if url is None:
        return None
    base = base_url.rstrip("/") if base_url else None
    base = base if base and len(base) <= 2000 else None  # longer: no link beats a cut one
    callback = JobWebhook(job_id=job.id, url=url, state="waiting", attempts=0, base_url=base)
    session.add(callback)
    session.flush()
    return callback
