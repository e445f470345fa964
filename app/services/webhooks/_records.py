"""The webhook records as anyone outside the database sees them: a job's callback and
its delivery log, a tenant's settings, and the message a receiver gets. Plain pydantic
records (the API's schemas re-export them: docs/openapi.json)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from autofusion.app.core.job_records import JobPublic
from autofusion.app.core.models import Job, JobWebhook, WebhookDelivery

__all__ = [
    "JobWebhooksPublic",
    "TenantWebhookPublic",
    "TenantWebhookUpdate",
    "WebhookDeliveryPublic",
    "absolute_links",
    "message_base_url",
    "message_body",
]


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every timestamp stored here is UTC."""
    if value is None:
        return None
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class WebhookDeliveryPublic(BaseModel):
    """One delivery attempt."""

    attempt: int
    at: datetime
    status_code: int | None = Field(description="The receiver's HTTP status; null: no answer")
    error: str | None = Field(description="Why the attempt failed; null when it succeeded")
    duration_ms: float
    next_attempt_at: datetime | None = Field(
        description="When the next attempt is due; null: no more attempts"
    )

    @classmethod
    def from_row(cls, row: WebhookDelivery) -> WebhookDeliveryPublic:
        return cls(
            attempt=row.attempt,
            at=_utc(row.at),
            status_code=row.status_code,
            error=row.error,
            duration_ms=round(row.duration_ms, 1),
            next_attempt_at=_utc(row.next_attempt_at),
        )


class JobWebhooksPublic(BaseModel):
    """A job's callback and its delivery log, oldest attempt first."""

    url: str | None = Field(description="The callback URL; null: the job has none")
    state: Literal["none", "waiting", "due", "delivered", "failed"] = Field(
        description="none: no callback; waiting: the job has not ended; due: a delivery "
        "is due (next_attempt_at); delivered: a receiver answered 2xx; failed: every "
        "attempt failed, or the host is no longer allowed"
    )
    message_id: str | None = Field(description="The webhook-id header, the same on each retry")
    links_base: str | None = Field(
        default=None,
        description="The address the message's links start with (they are absolute URLs): "
        "the server's public_url (AUTOFUSION_PUBLIC_URL) when set, else the address the job "
        "was submitted to; null: the links are null (a callback attached by a server "
        "version that did not keep that address, and no public_url)",
    )
    next_attempt_at: datetime | None = None
    deliveries: list[WebhookDeliveryPublic]

    @classmethod
    def from_rows(
        cls,
        callback: JobWebhook | None,
        deliveries: list[WebhookDelivery],
        public_url: str | None = None,
    ) -> JobWebhooksPublic:
        if callback is None:
            return cls(url=None, state="none", message_id=None, deliveries=[])
        due = callback.state == "due"
        return cls(
            url=callback.url,
            state=callback.state,  # type: ignore[arg-type]
            message_id=callback.message_id,
            links_base=message_base_url(public_url, callback),
            next_attempt_at=_utc(callback.next_attempt_at) if due else None,
            deliveries=[WebhookDeliveryPublic.from_row(d) for d in deliveries],
        )


class TenantWebhookPublic(BaseModel):
    """This tenant's webhook settings."""

    default_url: str | None = Field(
        description="The callback URL of this tenant's jobs that name no callback_url"
    )
    secret: str | None = Field(
        description="The whsec_ secret that signs this tenant's webhooks; null when they "
        "are signed with the server's own (webhook_secret), which its operator holds"
    )
    signed_with: Literal["tenant", "server"]
    allowed_hosts: list[str] = Field(description="The hosts this server calls back")


class TenantWebhookUpdate(BaseModel):
    """What ``PUT /v1/webhooks`` changes."""

    default_url: str | None = Field(
        max_length=2000,
        description="The callback URL of this tenant's jobs that name none; null: no default",
    )


def message_body(job: Job, base_url: str | None) -> bytes:
    """The JSON a receiver gets when ``job`` has ended: the same on every retry. Its
    links are absolute, made from ``base_url`` (``links_base``); without one (a callback
    attached before the server kept it, and no ``public_url``) they are null, never a
    path a receiver on another host cannot follow."""
    return json.dumps(_message(job, base_url), separators=(",", ":")).encode()


def message_base_url(public_url: str | None, callback: JobWebhook) -> str | None:
    """Where a message's links point: the configured ``public_url``, else the address
    the job was submitted to."""
    return public_url or callback.base_url


def absolute_links(links: dict[str, Any], base_url: str) -> dict[str, Any]:
    """The job resource's links (paths on this server) joined to ``base_url``."""
    base = base_url.rstrip("/")

    def joined(value: Any) -> Any:
        if isinstance(value, dict):
            return {name: joined(v) for name, v in value.items()}
        return f"{base}{value}" if isinstance(value, str) else value

    return joined(links)


def _message(job: Job, base_url: str | None) -> dict[str, Any]:
    public = JobPublic.from_job(job)
    summary = job.summary or {}
    speed = summary.get("speed") if isinstance(summary.get("speed"), dict) else {}
    data = {
        "id": public.id,
        "status": public.status.value,
        "verdict": speed.get("verdict"),
        "speedup": speed.get("speedup"),
        "fusions": summary.get("fusions"),
        "error": public.error.model_dump() if public.error is not None else None,
        "model_name": public.model_name,
        "created_at": public.created_at.isoformat(),
        "finished_at": public.finished_at.isoformat() if public.finished_at else None,
        "links": absolute_links(public.links.model_dump(), base_url) if base_url else None,
    }
    ended = public.finished_at or public.updated_at
    return {"type": f"job.{public.status.value}", "timestamp": ended.isoformat(), "data": data}
