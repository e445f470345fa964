"""Schemas of the webhooks: a job's delivery log and a tenant's settings (the records
live below HTTP, in ``app.services.webhooks``; these names are the published contract).

The message a receiver gets is documented in docs/service.md ("Webhooks"); its links are
absolute URLs, made from the server's ``public_url`` or the address the job was
submitted to, which the delivery log shows as ``links_base``."""

from __future__ import annotations

from autofusion.app.services.webhooks import (
    JobWebhooksPublic,
    TenantWebhookPublic,
    TenantWebhookUpdate,
    WebhookDeliveryPublic,
)

__all__ = [
    "JobWebhooksPublic",
    "TenantWebhookPublic",
    "TenantWebhookUpdate",
    "WebhookDeliveryPublic",
]
