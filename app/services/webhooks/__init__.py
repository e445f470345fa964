"""Webhooks (issue 27): a job that names a callback URL (the optimize option
``callback_url``, or its tenant's default) gets the job's summary POSTed there when it
ends, signed as the Standard Webhooks specification says, retried with backoff, every
attempt logged.

- ``_hosts``: which URLs may be called (``webhook_allowed_hosts``), checked at submit
  and before each delivery;
- ``_tenants``: a tenant's signing secret and default URL; a job's callback attached;
- ``_deliver``: one pass of the delivery loop (``deliver_due``), run by the reaper;
- ``_records`` and ``_reads``: the delivery log and settings as the API shows them.
"""

from autofusion.app.services.webhooks._deliver import Attempt, deliver_due, sign_headers
from autofusion.app.services.webhooks._hosts import (
    MAX_URL_LENGTH,
    callback_problem,
    check_callback_url,
    url_problem,
)
from autofusion.app.services.webhooks._reads import job_webhooks, tenant_settings
from autofusion.app.services.webhooks._records import (
    JobWebhooksPublic,
    TenantWebhookPublic,
    TenantWebhookUpdate,
    WebhookDeliveryPublic,
    absolute_links,
    message_base_url,
    message_body,
)
from autofusion.app.services.webhooks._tenants import (
    SigningSecret,
    attach_callback,
    rotate_secret,
    set_default_url,
    signing_secret,
    tenant_webhook,
)

__all__ = [
    "MAX_URL_LENGTH",
    "Attempt",
    "JobWebhooksPublic",
    "SigningSecret",
    "TenantWebhookPublic",
    "TenantWebhookUpdate",
    "WebhookDeliveryPublic",
    "absolute_links",
    "attach_callback",
    "callback_problem",
    "check_callback_url",
    "deliver_due",
    "job_webhooks",
    "message_base_url",
    "message_body",
    "rotate_secret",
    "set_default_url",
    "sign_headers",
    "signing_secret",
    "tenant_settings",
    "tenant_webhook",
    "url_problem",
]
