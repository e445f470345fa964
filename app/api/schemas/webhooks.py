"""Schemas of the webhooks: a job's delivery log and a tenant's settings (the records
live below HTTP, in ``app.services.webhooks``; these names are the published contract)."""

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
