"""The ORM. The job row, not the broker, is the source of truth for a job."""

from __future__ import annotations

import enum
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

__all__ = [
    "ApiKey",
    "Base",
    "DataUpload",
    "DataUploadStatus",
    "IdempotencyReservation",
    "Job",
    "JobArtifact",
    "JobStatus",
    "JobWebhook",
    "PatternRecord",
    "PatternVersion",
    "RegistryState",
    "Strategy",
    "StrategyVersion",
    "Tenant",
    "TenantWebhook",
    "Verdict",
    "PatternClassRule",
    "WebhookDelivery",
    "WorkerHeartbeat",
    "as_utc",
    "utcnow",
]


def utcnow() -> datetime:
    return datetime.now(UTC)


def as_utc(value: datetime) -> datetime:
    """A stored time as an aware UTC one: SQLite hands back naive datetimes, and every
    timestamp the service stores is UTC."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    type_annotation_map = {dict[str, Any]: JSON, list[Any]: JSON}


class JobStatus(enum.StrEnum):
    queued = "queued"
    running = "running"
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"

    @property
    def is_final(self) -> bool:
        return self in (JobStatus.succeeded, JobStatus.failed, JobStatus.cancelled)


class Tenant(Base):
    __tablename__ = "tenants"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class ApiKey(Base):
    __tablename__ = "api_keys"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    # The first characters of the key, shown in listings and used to find the row;
    # the key itself is never stored, only its sha256.
    prefix: Mapped[str] = mapped_column(String(16), index=True)
    key_hash: Mapped[str] = mapped_column(String(64), unique=True)
    scopes: Mapped[list[Any]] = mapped_column(JSON, default=list)
    name: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("tenant_id", "idempotency_key", name="uq_jobs_idempotency"),
        # The list's order (app/services/job_pages.py): a page is an index range scan.
        Index("ix_jobs_tenant_created_id", "tenant_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    status: Mapped[str] = mapped_column(String(16), index=True, default=JobStatus.queued.value)
    stage: Mapped[str] = mapped_column(String(32), default="queued")
    progress: Mapped[float] = mapped_column(Float, default=0.0)
    # Bumped on every change: the ETag of the job resource.
    revision: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(
        DateTime(timezone=True), default=utcnow, index=True
    )
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # At-least-once delivery: whoever holds an unexpired lease owns the job.
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    max_attempts: Mapped[int] = mapped_column(Integer, default=3)
    lease_until: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True, index=True
    )
    worker_id: Mapped[str | None] = mapped_column(String(200), nullable=True)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    idempotency_key: Mapped[str | None] = mapped_column(String(200), nullable=True)
    request_hash: Mapped[str] = mapped_column(String(64), default="")
    config: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    strategy: Mapped[str | None] = mapped_column(String(200), nullable=True)
    registry_version: Mapped[int | None] = mapped_column(Integer, nullable=True)
    model_name: Mapped[str] = mapped_column(String(500), default="model.onnx")
    model_digest: Mapped[str] = mapped_column(String(64))
    data_files: Mapped[list[Any]] = mapped_column(JSON, default=list)  # [{"name", "digest"}]
    fused_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    report_digest: Mapped[str | None] = mapped_column(String(64), nullable=True)
    summary: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Why a failed job failed, as a problem type slug (``check-failed``, ``crashed-twice``,
    # ...: ``app.core.errors.JOB_PROBLEMS``); None while nothing has failed.
    error_type: Mapped[str | None] = mapped_column(String(64), nullable=True)
    # One entry per attempt that ended without a result: {"attempt", "outcome" (signal:N,
    # timeout, memory, lost, error), "model_digest", "stage"}. Two identical deterministic
    # outcomes on the same model end the job (worker/execute.py).
    attempt_log: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)
    # The X-Request-ID of the request that created the job (app/api/request_ids.py): the
    # worker's and the sandbox's log lines for the job carry it. None for older jobs.
    request_id: Mapped[str | None] = mapped_column(String(128), nullable=True)
    # When each phase of the current attempt began: [{"stage", "at"}] (app/services/
    # job_phases.py); the dashboard shows the time per phase and estimates what is left.
    phases: Mapped[list[Any] | None] = mapped_column(JSON, nullable=True)


class JobArtifact(Base):
    """A blob of the artifact store that a job refers to (its model and data files, the
    fused model, the report and its renderings) and the blob's size. Blobs are shared by
    content, so a blob has a row per job that refers to it. What a tenant stores is the
    sum of its jobs' distinct blobs (app/services/quotas.py); a blob no row refers to is
    removed by retention (app/services/retention.py)."""

    __tablename__ = "job_artifacts"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    digest: Mapped[str] = mapped_column(String(64), primary_key=True, index=True)
    # None: not known yet (a job stored before this table); the retention sweep asks the
    # store and fills it in.
    size: Mapped[int | None] = mapped_column(BigInteger, nullable=True)


class IdempotencyReservation(Base):
    """An Idempotency-Key whose first request is still being received (uploaded, then
    checked): another request with the key meanwhile is answered 409 with Retry-After
    (app/services/idempotency.py). Removed once that request has ended, made its job or
    not; one older than the longest a request can take is taken over."""

    __tablename__ = "idempotency_reservations"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    # Whose reservation it is: only that request removes it.
    token: Mapped[str] = mapped_column(String(36))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class RegistryState(Base):
    """A single row: the registry's version, bumped by every pattern change."""

    __tablename__ = "registry_state"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=0)


class PatternRecord(Base):
    """The current state of a pattern; its history is in ``pattern_versions``."""

    __tablename__ = "patterns"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
    builtin: Mapped[bool] = mapped_column(Boolean, default=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class PatternVersion(Base):
    """One immutable version of a pattern, stamped with the registry version it made."""

    __tablename__ = "pattern_versions"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_pattern_versions"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    version: Mapped[int] = mapped_column(Integer)
    registry_version: Mapped[int] = mapped_column(Integer, index=True)
    change: Mapped[str] = mapped_column(String(16))  # create, update, enable, disable, delete
    enabled: Mapped[bool] = mapped_column(Boolean)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False)
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    created_by: Mapped[str | None] = mapped_column(String(200), nullable=True)


class Strategy(Base):
    """A named strategy: which patterns and options a job uses (``vision``, ``nlp``...)."""

    __tablename__ = "strategies"

    name: Mapped[str] = mapped_column(String(200), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, default=1)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class StrategyVersion(Base):
    __tablename__ = "strategy_versions"
    __table_args__ = (UniqueConstraint("name", "version", name="uq_strategy_versions"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200), index=True)
    version: Mapped[int] = mapped_column(Integer)
    data: Mapped[dict[str, Any]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# --- Liveness: worker heartbeats (issue 27) ---
class WorkerHeartbeat(Base):
    """A worker process says it is alive: its row is rewritten every
    ``worker_heartbeat_interval_s`` (``app.services.worker_health``). A row older than
    ``worker_stale_after_s`` is a worker that died or lost the database."""

    __tablename__ = "worker_heartbeats"

    name: Mapped[str] = mapped_column(String(255), primary_key=True)  # node/pid
    host: Mapped[str] = mapped_column(String(255))
    pid: Mapped[int] = mapped_column(Integer)
    mode: Mapped[str] = mapped_column(String(16))  # embedded, distributed
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    last_seen: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    running: Mapped[int] = mapped_column(Integer)  # jobs it runs now
    slots: Mapped[int] = mapped_column(Integer)  # jobs it runs at once at most


# --- Webhooks (issue 27) ---
class TenantWebhook(Base):
    """A tenant's webhook settings: its signing secret (``whsec_``; the service signs
    with it, so it is kept as it is, unlike an API key) and the callback URL its jobs
    use when they name none (``app.services.webhooks``)."""

    __tablename__ = "tenant_webhooks"

    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), primary_key=True)
    secret: Mapped[str | None] = mapped_column(String(120), nullable=True)
    default_url: Mapped[str | None] = mapped_column(String(2000), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class JobWebhook(Base):
    """A job's callback: ``waiting`` until the job ends, then ``due`` (``next_attempt_at``)
    until a delivery succeeds (``delivered``) or the attempts run out (``failed``).
    ``claimed_until``: a worker process is sending it (a compare-and-set takes it)."""

    __tablename__ = "job_webhooks"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True)
    url: Mapped[str] = mapped_column(String(2000))
    state: Mapped[str] = mapped_column(String(16), default="waiting", index=True)
    # The webhook-id header: one per message, the same on each retry (the receiver's
    # key to drop duplicates).
    message_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = mapped_column(
        DateTime(timezone=True), nullable=True, index=True
    )
    claimed_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    # The address the job was submitted to: the message's links are made absolute from
    # it when public_url is unset (null: a callback attached before migration 0012).
    base_url: Mapped[str | None] = mapped_column(String(2000), nullable=True)


class WebhookDelivery(Base):
    """One delivery attempt of a job's webhook: the delivery log."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    url: Mapped[str] = mapped_column(String(2000))
    attempt: Mapped[int] = mapped_column(Integer)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    status_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(Text, nullable=True)
    duration_ms: Mapped[float] = mapped_column(Float, default=0.0)
    # When the next attempt is due; None: this one was the last.
    next_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


# --- Verdicts: what measured selection learned (issue 28) ---
class Verdict(Base):
    """One measured decision on a group of fusions: a region signature (the pattern, its
    spec's hash, the fused ops, the regions' op types, attributes and shape classes) timed
    on a machine class (CPU, instruction set, onnxruntime version, threads, level). Rows
    are never overwritten: measurements of one signature on one class are combined when
    read (``app.services.verdicts``). ``job_id`` is the job that measured it (no foreign
    key: retention deletes jobs, the evidence stays); ``tenant_id`` the job's tenant."""

    __tablename__ = "verdicts"
    __table_args__ = (
        Index("ix_verdicts_lookup", "machine_key", "signature"),
        Index("ix_verdicts_host", "onnxruntime", "cpu"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    signature: Mapped[str] = mapped_column(String(64))
    pattern: Mapped[str] = mapped_column(String(200), index=True)
    pattern_hash: Mapped[str] = mapped_column(String(64))
    group_key: Mapped[str] = mapped_column(String(500))
    region: Mapped[dict[str, Any]] = mapped_column(JSON)
    machine_key: Mapped[str] = mapped_column(String(64))
    machine: Mapped[dict[str, Any]] = mapped_column(JSON)
    onnxruntime: Mapped[str] = mapped_column(String(40))
    cpu: Mapped[str] = mapped_column(String(200))
    target: Mapped[str] = mapped_column(String(40))
    median: Mapped[float] = mapped_column(Float)
    low: Mapped[float] = mapped_column(Float)
    high: Mapped[float] = mapped_column(Float)
    confidence: Mapped[float] = mapped_column(Float)
    runs: Mapped[int] = mapped_column(Integer)
    verdict: Mapped[str] = mapped_column(String(32), index=True)
    with_ms: Mapped[float | None] = mapped_column(Float, nullable=True)
    predicted: Mapped[dict[str, Any] | None] = mapped_column(JSON, nullable=True)
    measured_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
    job_id: Mapped[str | None] = mapped_column(String(36), nullable=True, index=True)
    tenant_id: Mapped[str | None] = mapped_column(String(64), nullable=True)
    source: Mapped[str] = mapped_column(String(16), default="measured")  # or "imported"
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class PatternClassRule(Base):
    """A pattern disabled on one machine class (its ``machine_key``), by a person from the
    dashboard or automatically (``verdicts_auto_disable``), with the evidence: the
    combined verdict it was decided on. Deleting the row enables it again."""

    __tablename__ = "pattern_class_rules"
    __table_args__ = (UniqueConstraint("pattern", "machine_key", name="uq_pattern_class_rules"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    pattern: Mapped[str] = mapped_column(String(200), index=True)
    machine_key: Mapped[str] = mapped_column(String(64), index=True)
    machine: Mapped[dict[str, Any]] = mapped_column(JSON)
    reason: Mapped[str] = mapped_column(Text)
    evidence: Mapped[dict[str, Any]] = mapped_column(JSON)  # combined verdict, verdict ids
    created_by: Mapped[str] = mapped_column(String(200))  # a key's name, or "auto"
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


# --- Data uploads: big external-data files, sent in parts (issue 29) ---
class DataUploadStatus(enum.StrEnum):
    receiving = "receiving"
    complete = "complete"


class DataUpload(Base):
    """A data file sent in parts (``PATCH /v1/uploads/{id}``), for ``POST /v1/optimize``'s
    ``data_upload`` to name (app/services/uploads/_staged.py). While ``receiving``, each
    part is a blob of the store listed in ``parts`` ([{"digest", "size", "skip"}]: the
    blob begins with ``skip`` bytes of header, then ``size`` bytes of the file); once
    ``complete``, ``digest`` is the whole file's blob and ``parts`` is empty. Both count
    as referenced for retention and as stored for the tenant's quota (a receiving upload
    by its declared ``size``). ``revision`` moves on with every change: the
    compare-and-set of two requests that write the row at once."""

    __tablename__ = "data_uploads"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant_id: Mapped[str] = mapped_column(ForeignKey("tenants.id"), index=True)
    name: Mapped[str] = mapped_column(String(255))
    size: Mapped[int] = mapped_column(BigInteger)
    received: Mapped[int] = mapped_column(BigInteger, default=0)
    sha256: Mapped[str | None] = mapped_column(String(64), nullable=True)  # as declared
    parts: Mapped[list[Any]] = mapped_column(JSON, default=list)
    digest: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    status: Mapped[str] = mapped_column(String(16), default=DataUploadStatus.receiving.value)
    revision: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), index=True)
