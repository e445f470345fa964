"""An Idempotency-Key in use: a second request with the key while the first is still
being received is answered 409, not run a second time.

``POST /v1/optimize`` reserves its key before it reads the body (a row of
``idempotency_reservations``, committed at once, so every API process sees it) and
removes the reservation when the request ends, whether it made a job or not. Meanwhile a
request with the same key meets the row: ``409 idempotency-key-in-use`` with
``Retry-After``. Once the job exists, a request with its key needs no reservation: it is
replayed (or refused with 422 for other inputs) as before. A reservation older than the
longest a request can take (its API process was killed mid-upload) is taken over.

A key lasts ``idempotency_key_ttl_s`` from its job's creation (:func:`keyed_job`): after
that the key makes a new job, run with the registry and server of now, and moves to it.

Each function flushes; the caller commits (and answers the ``IntegrityError`` of a
reservation made at the same moment with :func:`key_in_use`).
"""

from __future__ import annotations

import uuid
from datetime import UTC, timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from autofusion.app.core.errors import ProblemError
from autofusion.app.core.models import IdempotencyReservation, Job, utcnow

__all__ = ["key_expired", "key_in_use", "keyed_job", "release_key", "reserve_key"]


def key_expired(job: Job, ttl_s: float | None) -> bool:
    """Whether ``job`` was made longer than ``ttl_s`` ago (never, without a ttl)."""
    if ttl_s is None:
        return False
    created = job.created_at  # naive from SQLite: every timestamp stored is UTC
    created = created if created.tzinfo else created.replace(tzinfo=UTC)
    return created <= utcnow() - timedelta(seconds=ttl_s)


def keyed_job(session: Session, tenant_id: str, key: str, ttl_s: float | None) -> Job | None:
    """The job an earlier request with this key made, while the key lasts; None when no
    job has it or that job is older than ``ttl_s`` (the request makes a new one)."""
    job = session.scalars(
        select(Job).where(Job.tenant_id == tenant_id, Job.idempotency_key == key)
    ).first()
    return None if job is None or key_expired(job, ttl_s) else job


def key_in_use(key: str, retry_after_s: int) -> ProblemError:
    return ProblemError(
        409,
        "idempotency-key-in-use",
        "Idempotency key in use",
        f"a request with Idempotency-Key {key!r} is still being received; retry after "
        f"{retry_after_s} s (Retry-After) to get its job, or send a new key for a new request",
        headers={"Retry-After": str(retry_after_s)},
    )


def reserve_key(
    session: Session,
    tenant_id: str,
    key: str,
    *,
    stale_s: float,
    retry_after_s: int,
    ttl_s: float | None = None,
) -> str | None:
    """A token for the reservation of ``key``, or None when a job already has the key
    (and made it less than ``ttl_s`` ago). 409 while another request holds it (taken
    over once older than ``stale_s``)."""
    if keyed_job(session, tenant_id, key, ttl_s) is not None:
        return None
    token = str(uuid.uuid4())
    held = session.get(IdempotencyReservation, (tenant_id, key))
    if held is None:
        session.add(IdempotencyReservation(tenant_id=tenant_id, key=key, token=token))
        session.flush()  # a concurrent reservation: IntegrityError, for the caller
        return token
    started = held.started_at  # naive from SQLite: every timestamp stored is UTC
    started = started if started.tzinfo else started.replace(tzinfo=UTC)
    if started > utcnow() - timedelta(seconds=stale_s):
        raise key_in_use(key, retry_after_s)
    taken = session.execute(  # compare-and-set: one of two late requests takes it over
        update(IdempotencyReservation)
        .where(
            IdempotencyReservation.tenant_id == tenant_id,
            IdempotencyReservation.key == key,
            IdempotencyReservation.token == held.token,
        )
        .values(token=token, started_at=utcnow())
        .execution_options(synchronize_session=False)
    )
    if taken.rowcount != 1:
        raise key_in_use(key, retry_after_s)
    return token


def release_key(session: Session, tenant_id: str, key: str, token: str) -> None:
    """Remove this request's reservation (not one that took it over since)."""
    session.execute(
        delete(IdempotencyReservation).where(
            IdempotencyReservation.tenant_id == tenant_id,
            IdempotencyReservation.key == key,
            IdempotencyReservation.token == token,
        )
    )
    session.flush()
