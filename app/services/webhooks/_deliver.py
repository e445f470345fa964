"""Delivering webhooks: a job that has ended gets its callback POSTed, signed, and
retried with backoff until a receiver answers 2xx or the attempts run out.

``deliver_due`` is one pass, run every ``webhook_poll_s`` by each worker process's
reaper (``worker/reaper.py``), never in a request or the job loop. The database holds
the schedule (``JobWebhook``) and the log (``WebhookDelivery``), so a restart loses
nothing: a delivery claimed by a process that died is due again once its claim
expires. A pass holds no database connection while it waits on a receiver.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session
from standardwebhooks import Webhook

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.models import Job, JobStatus, JobWebhook, WebhookDelivery, utcnow
from autofusion.app.services.webhooks._hosts import url_problem
from autofusion.app.services.webhooks._records import message_base_url, message_body
from autofusion.app.services.webhooks._tenants import signing_secret

__all__ = ["Attempt", "deliver_due", "sign_headers"]

logger = logging.getLogger(__name__)

_FINAL = [s.value for s in JobStatus if s.is_final]
_BATCH = 20
# A claim outlives the attempt's timeout by this much before another process may retry.
_CLAIM_MARGIN_S = 60.0
USER_AGENT = "autofusion-webhooks/1"


@dataclass(frozen=True)
class _Message:
    job_id: str
    url: str
    message_id: str
    attempt: int
    body: bytes
    secret: str


@dataclass(frozen=True)
class Attempt:
    """How one delivery attempt went (what the log records)."""

    job_id: str
    attempt: int
    status_code: int | None
    error: str | None
    duration_ms: float
    next_attempt_at: datetime | None = None
    final: bool = False  # no retry could help (the host is not allowed)

    @property
    def delivered(self) -> bool:
        return self.error is None


def sign_headers(message_id: str, body: bytes, secret: str, sent_at: datetime) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt: its id, the time it is sent and
    ``v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">``."""
    signature = Webhook(secret).sign(message_id, sent_at, body)
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(int(sent_at.timestamp())),
        "webhook-signature": signature,
    }


def deliver_due(
    settings: Settings,
    *,
    clock: Callable[[], datetime] = utcnow,
    client: httpx.Client | None = None,
) -> list[Attempt]:
    """One pass: schedule the callbacks of jobs that have ended, then make each attempt
    that is due; returns the attempts made."""
    url = settings.resolved_database_url
    with session_scope(url) as session:
        _schedule_ended(session, clock())
        due = _due(session, clock())
    if not due:
        return []
    own = client is None
    client = client or _client(settings)
    try:
        return [a for job_id in due if (a := _attempt(settings, job_id, clock, client))]
    finally:
        if own:
            client.close()


def _client(settings: Settings) -> httpx.Client:
    # No redirects (a 3xx is a failed attempt: the operator allowed this host, not the
    # one it points to); no proxies or .netrc from the environment: nothing but the
    # signed body goes to a receiver.
    return httpx.Client(
        timeout=settings.webhook_timeout_s,
        follow_redirects=False,
        trust_env=False,
        headers={"user-agent": USER_AGENT, "content-type": "application/json"},
    )


def _schedule_ended(session: Session, now: datetime) -> None:
    """Callbacks whose job has ended become due now, each with its message id."""
    ended = session.scalars(
        select(JobWebhook.job_id)
        .join(Job, Job.id == JobWebhook.job_id)
        .where(JobWebhook.state == "waiting", Job.status.in_(_FINAL))
        .limit(100)
    ).all()
    for job_id in ended:
        session.execute(
            update(JobWebhook)
            .where(JobWebhook.job_id == job_id, JobWebhook.state == "waiting")
            .values(state="due", message_id=f"msg_{uuid.uuid4().hex}", next_attempt_at=now)
            .execution_options(synchronize_session=False)
        )


def _due(session: Session, now: datetime) -> list[str]:
    return list(
        session.scalars(
            select(JobWebhook.job_id)
            .where(
                JobWebhook.state == "due",
                JobWebhook.next_attempt_at <= now,
                or_(JobWebhook.claimed_until.is_(None), JobWebhook.claimed_until < now),
            )
            .order_by(JobWebhook.next_attempt_at)
            .limit(_BATCH)
        ).all()
    )


def _attempt(
    settings: Settings, job_id: str, clock: Callable[[], datetime], client: httpx.Client
) -> Attempt | None:
    message = _claim(settings, job_id, clock())
    if message is None:  # another process took it, or it is no longer due
        return None
    attempt = _send(message, settings, client)
    return _record(settings, message, attempt, clock())


def _claim(settings: Settings, job_id: str, now: datetime) -> _Message | None:
    """Take the delivery (compare-and-set) and read what to send; the commit makes a
    tenant secret made here visible before anything is signed with it."""
    until = now + timedelta(seconds=settings.webhook_timeout_s + _CLAIM_MARGIN_S)
    with session_scope(settings.resolved_database_url) as session:
        taken = session.execute(
            update(JobWebhook)
            .where(
                JobWebhook.job_id == job_id,
                JobWebhook.state == "due",
                or_(JobWebhook.claimed_until.is_(None), JobWebhook.claimed_until < now),
            )
            .values(claimed_until=until)
            .execution_options(synchronize_session=False)
        )
        if taken.rowcount != 1:
            return None
        callback = session.get(JobWebhook, job_id, populate_existing=True)
        job = session.get(Job, job_id)
        assert callback is not None and job is not None and callback.message_id
        secret = signing_secret(session, job.tenant_id, settings)
        return _Message(
            job_id,
            callback.url,
            callback.message_id,
            callback.attempts + 1,
            message_body(job, message_base_url(settings.public_url, callback)),
            secret.value,
        )


def _send(message: _Message, settings: Settings, client: httpx.Client) -> Attempt:
    """POST the message once; the receiver's body is never read."""
    refused = url_problem(message.url, settings.webhook_allowed_hosts)
    if refused is not None:
        return Attempt(
            message.job_id, message.attempt, None, f"not sent: {refused}", 0.0, final=True
        )
    headers = sign_headers(message.message_id, message.body, message.secret, datetime.now(UTC))
    started = time.perf_counter()
    status, error = None, None
    try:
        with client.stream("POST", message.url, content=message.body, headers=headers) as answer:
            status = answer.status_code
    except httpx.TimeoutException:
        error = f"no answer within {settings.webhook_timeout_s:g} s (webhook_timeout_s)"
    except httpx.HTTPError as exc:
        error = f"could not connect: {exc}" if isinstance(exc, httpx.ConnectError) else str(exc)
        error = error or type(exc).__name__
    except Exception as exc:  # an attempt, logged and counted: never a claim retried for ever
        logger.exception("webhook of job %s: sending failed", message.job_id)
        error = f"could not send: {type(exc).__name__}: {exc}"
    duration_ms = (time.perf_counter() - started) * 1000
    if status is not None and not 200 <= status < 300:
        error = f"answered {status}"
        if 300 <= status < 400:
            error += " (a redirect: not followed; give the final URL as the callback)"
    return Attempt(message.job_id, message.attempt, status, error, duration_ms)


def _record(settings: Settings, message: _Message, attempt: Attempt, now: datetime) -> Attempt:
    """Log the attempt and schedule the next one (exponential backoff) or none."""
    retry = not attempt.delivered and not attempt.final
    retry = retry and attempt.attempt < settings.webhook_max_attempts
    delay = settings.webhook_retry_s * 2 ** (attempt.attempt - 1)
    next_at = now + timedelta(seconds=delay) if retry else None
    state = "delivered" if attempt.delivered else "due" if retry else "failed"
    with session_scope(settings.resolved_database_url) as session:
        session.execute(
            update(JobWebhook)
            .where(JobWebhook.job_id == message.job_id)
            .values(
                state=state, attempts=attempt.attempt, next_attempt_at=next_at, claimed_until=None
            )
            .execution_options(synchronize_session=False)
        )
        session.add(
            WebhookDelivery(
                job_id=message.job_id,
                url=message.url,
                attempt=attempt.attempt,
                at=now,
                status_code=attempt.status_code,
                error=attempt.error,
                duration_ms=attempt.duration_ms,
                next_attempt_at=next_at,
            )
        )
    _log(message, attempt, state, next_at)
    return replace(attempt, next_attempt_at=next_at)


def _log(message: _Message, attempt: Attempt, state: str, next_at: datetime | None) -> None:
    if attempt.delivered:
        logger.info("webhook of job %s delivered (%s)", message.job_id, attempt.status_code)
    elif next_at is not None:
        logger.warning(
            "webhook of job %s, attempt %d: %s; next attempt at %s",
            message.job_id,
            attempt.attempt,
            attempt.error,
            next_at.isoformat(timespec="seconds"),
        )
    else:
        logger.warning(
            "webhook of job %s %s after attempt %d: %s",
            message.job_id,
            state,
            attempt.attempt,
            attempt.error,
        )
