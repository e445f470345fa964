"""One ``Settings`` for the service, read from ``AUTOFUSION_*`` environment variables.

Embedded mode (the default) needs nothing set: SQLite, Celery over kombu's
``filesystem://`` transport and artifacts all live under ``data_dir``. Distributed mode
sets ``database_url`` (PostgreSQL), ``broker_url`` (Redis) and an S3 store.

Where a value comes from, first match wins: keyword arguments (the CLI's flags), the
environment, a ``.env`` file (``AUTOFUSION_ENV_FILE``, default ``./.env``), a secrets
directory (``AUTOFUSION_SECRETS_DIR``, default ``/run/secrets`` when it exists: one file
per setting, named as its variable, e.g. ``autofusion_database_url``, as Docker and
Kubernetes mount secrets), then the defaults.

Credentials (the database and broker URLs, which may carry a password, and the S3 keys)
are ``SecretStr``: ``repr``, ``str`` and ``model_dump`` show ``**********``; code that
needs the value asks for it (``resolved_database_url``, ``s3_client_options()``), and
``redact_url`` is the form to log.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from autofusion.app.core.webhook_secrets import is_webhook_secret

__all__ = ["DEFAULT_SECRETS_DIR", "Settings", "get_settings", "redact_url"]

ENV_FILE_VARIABLE = "AUTOFUSION_ENV_FILE"
SECRETS_DIR_VARIABLE = "AUTOFUSION_SECRETS_DIR"
DEFAULT_ENV_FILE = ".env"
DEFAULT_SECRETS_DIR = "/run/secrets"


def _sources() -> dict[str, Any]:
    """The ``.env`` file and the secrets directory of this process, read at each
    ``Settings()`` (the environment may change between two, as in tests)."""
    env_file = os.environ.get(ENV_FILE_VARIABLE, DEFAULT_ENV_FILE) or None
    secrets_dir = os.environ.get(SECRETS_DIR_VARIABLE)
    if secrets_dir is None:  # the conventional mount, where there is one
        secrets_dir = DEFAULT_SECRETS_DIR if os.path.isdir(DEFAULT_SECRETS_DIR) else None
    return {"_env_file": env_file, "_secrets_dir": secrets_dir or None}


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: the form to log."""
    scheme, sep, rest = url.partition("://")
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    user, colon, _ = userinfo.partition(":")
    return f"{scheme}{sep}{user}{':***' if colon else ''}@{host}"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="AUTOFUSION_",
        extra="ignore",
        env_file_encoding="utf-8",
        # A validation error prints no input: the inputs hold the credentials.
        hide_input_in_errors=True,
    )

    def __init__(self, **values: Any) -> None:
        # ``_env_file=None, _secrets_dir=None`` reads neither (a sandboxed child does).
        for key, value in _sources().items():
            values.setdefault(key, value)
        super().__init__(**values)

    data_dir: Path = Path("data")
    # Empty means the embedded defaults under data_dir. Secret: a URL may carry a password.
    database_url: SecretStr = SecretStr("")
    broker_url: SecretStr = SecretStr("")
    # Run a Celery worker thread inside the API process (embedded mode).
    embedded_worker: bool = True
    # Apply database migrations when the API starts (compose runs a one-shot instead).
    migrate_on_start: bool = True

    artifact_store: Literal["local", "s3"] = "local"
    s3_bucket: str = "autofusion"
    s3_endpoint_url: str | None = None
    s3_region: str | None = None
    # Unset: boto3's own sources (AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile, an
    # instance role). Set (e.g. as files in the secrets directory): these.
    s3_access_key_id: SecretStr | None = None
    s3_secret_access_key: SecretStr | None = None

    # Auth: embedded on 127.0.0.1 may run without keys; anything else should not.
    require_api_keys: bool = False
    default_tenant: str = "default"

    # Log lines (app/core/logs.py): "json" (one object a line, for a log collector),
    # "text", or "auto": text on a terminal, JSON otherwise.
    log_format: Literal["auto", "json", "text"] = "auto"

    # Upload limits, enforced while the body streams (before any parsing).
    max_upload_bytes: int = Field(default=2 * 1024**3, ge=1)
    max_tensor_elements: int = Field(default=2 * 1024**3, ge=1)
    allowed_op_domains: list[str] = Field(
        default_factory=lambda: [
            "",
            "ai.onnx",
            "ai.onnx.ml",
            "com.microsoft",
            "ai.onnx.preview.training",
        ]
    )

    # Jobs
    job_time_limit_s: int = Field(default=900, ge=1)
    job_memory_limit_mb: int = Field(default=8192, ge=64)
    # Before the sandbox starts, the worker predicts the job's peak memory from the
    # model's bytes and the config (fusion_core.predict_memory) and fails the job as
    # `memory-predicted` when the prediction passes the limit by more than the margin
    # (a fraction of the limit): the prediction errs high, so a job that may fit runs.
    job_memory_prediction: bool = True
    job_memory_prediction_margin: float = Field(default=0.25, ge=0)
    lease_s: int = Field(default=60, ge=1)
    max_attempts: int = Field(default=3, ge=1)
    reaper_interval_s: float = Field(default=15.0, gt=0)
    # Redis re-delivers unacknowledged tasks after this; must exceed the job time limit.
    visibility_timeout_s: int = Field(default=3600, ge=1)
    retry_after_s: int = Field(default=2, ge=1)
    # How often the server-sent event stream of a job polls its row.
    events_poll_s: float = Field(default=0.5, gt=0)

    @model_validator(mode="after")
    def _visibility_covers_jobs(self) -> Settings:
        if self.visibility_timeout_s <= self.job_time_limit_s:
            raise ValueError(
                f"visibility_timeout_s ({self.visibility_timeout_s}) must exceed "
                f"job_time_limit_s ({self.job_time_limit_s}), or Redis re-delivers running jobs"
            )
        return self

    @property
    def resolved_database_url(self) -> str:
        url = self.database_url.get_secret_value()
        return url or f"sqlite:///{(self.data_dir / 'autofusion.db').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url.get_secret_value() or "filesystem://"

    def s3_client_options(self) -> dict[str, Any]:
        """Keyword arguments of ``boto3.client("s3", ...)``: endpoint, region and, when
        set, the credentials."""
        options: dict[str, Any] = {
            "endpoint_url": self.s3_endpoint_url,
            "region_name": self.s3_region,
        }
        if self.s3_access_key_id is not None:
            options["aws_access_key_id"] = self.s3_access_key_id.get_secret_value()
        if self.s3_secret_access_key is not None:
            options["aws_secret_access_key"] = self.s3_secret_access_key.get_secret_value()
        return options

    @property
    def is_embedded_broker(self) -> bool:
        return self.resolved_broker_url.startswith("filesystem://")

    @property
    def jobs_dir(self) -> Path:
        return self.data_dir / "jobs"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def broker_dir(self) -> Path:
        return self.data_dir / "broker"

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    # Request resources (issue 15, item 2). Upload bodies stream to disk holding no
    # database connection; these bound how many stream at once, per process: over a
    # limit, 429 with Retry-After.
    max_concurrent_uploads: int = Field(default=16, ge=1)
    max_concurrent_uploads_per_tenant: int = Field(default=4, ge=1)
    # Every other request body (forms, JSON): 413 from Content-Length or while it
    # streams. The dashboard's login form needs a few hundred bytes.
    max_form_bytes: int = Field(default=4 * 1024**2, ge=1)
    max_login_bytes: int = Field(default=8 * 1024, ge=1)
    # Slow clients: a body must arrive at min_body_rate_bytes_s (16 KiB/s: a 2 GiB upload
    # may take 36 h at that rate; a trickle meant to hold a slot is cut) once the first
    # body_rate_grace_s have passed, with no gap over body_idle_timeout_s and in
    # body_total_timeout_s at most; otherwise 408 (and an upload's folder is removed).
    min_body_rate_bytes_s: int = Field(default=16 * 1024, ge=0)
    body_rate_grace_s: float = Field(default=10.0, ge=0)
    body_idle_timeout_s: float = Field(default=30.0, gt=0)
    body_total_timeout_s: float = Field(default=3600.0, gt=0)
    # How long a resolved API key is trusted without asking the database again
    # (app/services/auth.py); 0 turns the cache off.
    api_key_cache_s: float = Field(default=10.0, ge=0)

    # Faults (issue 15, item 7). A worker's final write of a finished attempt (result,
    # artifacts, status) is retried with backoff for this long while the database is
    # unreachable, instead of discarding the work (worker/execute.py).
    final_write_retry_s: float = Field(default=60.0, ge=0)
    # Scratch folders (data_dir/jobs, data_dir/downloads), upload folders
    # (data_dir/uploads) and the local store's temporary files untouched for this long,
    # that no live process or request holds, are removed: at worker start and every
    # scratch_sweep_interval_s by the reaper, and likewise by the API process
    # (app/services/scratch.py).
    scratch_max_age_s: float = Field(default=3600.0, gt=0)
    scratch_sweep_interval_s: float = Field(default=300.0, gt=0)

    # Model work the API hands to a child process (issue 15, item 1; issue 26): every
    # upload check and every pattern trial
    # (app/services/model_work.py). Each child gets this wall clock (then its process
    # group is killed), CPU time and address space; at most api_sandbox_concurrency run
    # at once per API process, a request waits api_sandbox_queue_s for a free slot and
    # then answers 503 with Retry-After. A model over a limit answers 422.
    api_sandbox_time_limit_s: float = Field(default=60.0, gt=0)
    api_sandbox_cpu_limit_s: int = Field(default=60, ge=1)
    api_sandbox_memory_limit_mb: int = Field(default=6144, ge=256)
    api_sandbox_concurrency: int = Field(default=4, ge=1)
    # Of those, what one tenant (or, without keys, one client address) may hold at once;
    # trials may hold half of them: hostile trials and big uploads cannot take them all.
    api_sandbox_per_tenant: int = Field(default=1, ge=1)
    # 60 s: a burst of eight million-node uploads checks four at a time, about 20 s each;
    # with 10 s, half of them were refused with 503.
    api_sandbox_queue_s: float = Field(default=60.0, ge=0)

    # Upload validation caps (issue 15, item 5; app/services/model_checks.py): nodes in
    # all graphs, subgraphs and functions together, and how deep subgraphs (If/Loop/Scan
    # bodies) may nest. Over either: 422 naming the setting.
    max_model_nodes: int = Field(default=1_000_000, ge=1)
    max_graph_depth: int = Field(default=64, ge=1)

    # --- Quotas and retention (issue 26) ---
    # Per tenant, checked when a job is submitted (app/services/quotas.py): queued jobs
    # (429 too-many-queued-jobs) and the bytes its jobs' artifacts take in the store
    # (507 storage-quota-exceeded); 0 turns a limit off. The defaults keep one machine
    # safe: 20 queued jobs are hours of work for one worker, 10 GiB is a dozen large models.
    max_queued_jobs_per_tenant: int = Field(default=20, ge=0)
    max_stored_bytes_per_tenant: int = Field(default=10 * 1024**3, ge=0)
    # Running jobs per tenant, enforced where a worker claims a job (app/services/
    # job_claims.py): a tenant at its limit leaves its next job queued and a worker takes
    # another tenant's job instead; the held job is tried again after held_job_retry_s.
    max_running_jobs_per_tenant: int = Field(default=2, ge=0)
    held_job_retry_s: float = Field(default=5.0, gt=0)
    # Retention (app/services/retention.py), swept by the reaper every
    # scratch_sweep_interval_s: a job that ended job_retention_s ago is deleted with its
    # artifacts, and while all jobs' artifacts take more than max_stored_bytes_total the
    # oldest ended jobs go first. Never a queued or running job. 0 keeps jobs for ever /
    # sets no total cap.
    job_retention_s: float = Field(default=30 * 86400.0, ge=0)
    max_stored_bytes_total: int = Field(default=50 * 1024**3, ge=0)

    # --- Data uploads: big external-data files (issue 29) ---
    # POST /v1/uploads takes one data file of up to max_data_file_bytes (a 7B decoder's
    # weights are 4-28 GB), sent in PATCHes that resume where the last one stopped, for
    # POST /v1/optimize's data_upload field to name (app/services/uploads/_staged.py).
    # A tenant may have max_open_uploads_per_tenant still receiving (429 beyond); an
    # upload not written for upload_expiry_s is deleted by the retention sweep.
    max_data_file_bytes: int = Field(default=64 * 1024**3, ge=1)
    max_open_uploads_per_tenant: int = Field(default=32, ge=1)
    upload_expiry_s: float = Field(default=86400.0, gt=0)

    # --- Sandbox identity and limits (issue 26) ---
    # A service running as root starts each sandbox as this unprivileged user (its own
    # folder writable, nothing else of data_dir readable), in a network namespace of its
    # own when sandbox_isolate_network; "" keeps the service's user (not advised).
    # A service that is not root cannot switch: it says so at start.
    sandbox_user: str = "nobody"
    sandbox_isolate_network: bool = True
    # Processes and threads of the sandbox user, all sandboxes together (RLIMIT_NPROC).
    sandbox_max_processes: int = Field(default=1024, ge=16)
    # The largest file a job's sandbox may write (RLIMIT_FSIZE; the fused model, its
    # data file, the report), and an API sandbox's (it writes only small results).
    job_file_size_limit_mb: int = Field(default=16384, ge=16)
    api_sandbox_file_size_limit_mb: int = Field(default=64, ge=1)
    # Pattern trials (POST /v1/patterns/{name}/test) one tenant may run at once, per API
    # process; over it, 429 too-many-trials with Retry-After.
    max_concurrent_trials_per_tenant: int = Field(default=1, ge=1)
    # CPU seconds of a job's sandbox (RLIMIT_CPU), a backstop to job_time_limit_s;
    # unset: the time limit times this machine's cores.
    job_cpu_limit_s: int | None = Field(default=None, ge=1)

    # --- Startup and smaller checks (issue 26) ---
    # The reaper sends a queued job again when its message may be lost: untouched for a
    # minute while nothing runs (idle workers would have taken it), but while jobs run
    # (the workers are busy, the job waits its turn) only after this long.
    queued_resend_busy_s: float = Field(default=1800.0, gt=0)
    # The dashboard's cookie is a session token signed with this secret (HMAC-SHA256),
    # never the API key. Unset: a random secret kept in data_dir/ui_session.key (made at
    # first use); set it (e.g. as a secret file) where several API processes share no
    # data_dir. Changing it signs everyone out.
    ui_session_secret: SecretStr | None = None
    # How long a dashboard sign-in lasts.
    ui_session_max_age_s: int = Field(default=12 * 3600, ge=60)
    # The cookie is Secure when the request came over https (behind a TLS proxy, run
    # uvicorn with its proxy headers trusted); true: always, whatever the request says.
    ui_cookie_secure: bool = False

    # --- Liveness: worker heartbeats (issue 27) ---
    # Every worker process (the embedded thread, each `autofusion worker`) rewrites its
    # row in worker_heartbeats this often; a row older than worker_stale_after_s is a
    # worker that died or lost the database (app/services/worker_health.py).
    worker_heartbeat_interval_s: float = Field(default=5.0, gt=0)
    worker_stale_after_s: float = Field(default=30.0, gt=0)
    # /readyz answers 503 while no worker is alive. Off: an API whose load balancer
    # reads /readyz keeps taking jobs (they wait, queued) while the workers are down.
    readyz_requires_worker: bool = True
    # The embedded worker starts again after its thread died: the first time after
    # the min, each next time after twice as long, at most the max (a worker that then
    # ran for the max starts from the min again).
    embedded_worker_restart_min_s: float = Field(default=1.0, gt=0)
    embedded_worker_restart_max_s: float = Field(default=60.0, gt=0)

    @model_validator(mode="after")
    def _liveness_bounds(self) -> Settings:
        if self.worker_stale_after_s <= self.worker_heartbeat_interval_s:
            raise ValueError(
                f"worker_stale_after_s ({self.worker_stale_after_s:g}) must exceed "
                f"worker_heartbeat_interval_s ({self.worker_heartbeat_interval_s:g}), or "
                "live workers look dead between two heartbeats"
            )
        if self.embedded_worker_restart_max_s < self.embedded_worker_restart_min_s:
            raise ValueError(
                "embedded_worker_restart_max_s must be at least embedded_worker_restart_min_s"
            )
        return self

    # --- Webhooks (issue 27) ---
    # The hosts a job's callback_url may name (app/services/webhooks): "ci.example.com"
    # (any port), "ci.example.com:8443" (that port), "*.example.com" (its subdomains).
    # Empty: webhooks are off and a callback_url is refused (422). The environment takes
    # a JSON list or a comma-separated one.
    webhook_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    # Signs the webhooks of a tenant that has no secret of its own (a keyless server's
    # one tenant): "whsec_" and base64. Unset: each tenant's secret is made on first use.
    webhook_secret: SecretStr | None = None
    # One delivery attempt: connect and answer within this; then up to
    # webhook_max_attempts in all, the n-th retry webhook_retry_s * 2**(n-1) after the
    # one before (15, 30, 60, 120 s: five attempts over about four minutes).
    webhook_timeout_s: float = Field(default=5.0, gt=0, le=60)
    webhook_max_attempts: int = Field(default=5, ge=1, le=20)
    webhook_retry_s: float = Field(default=15.0, gt=0)
    # How often each worker process looks for deliveries that are due.
    webhook_poll_s: float = Field(default=1.0, gt=0)
    # The address clients reach this server at ("https://autofusion.example.com", or a
    # proxy's, with a path prefix if it adds one): a webhook's links are made absolute
    # from it. Unset: from the address of the request that submitted the job.
    public_url: str | None = None

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(
                'must be an absolute http(s) URL, e.g. "https://autofusion.example.com"'
            )
        if parts.query or parts.fragment:
            raise ValueError("must have no query (?...) and no fragment (#...)")
        return value.strip().rstrip("/")

    @field_validator("webhook_allowed_hosts", mode="before")
    @classmethod
    def _hosts_list(cls, value: Any) -> Any:
        if isinstance(value, str):  # the environment: JSON, or "a.example.com,b.example.com"
            text = value.strip()
            value = json.loads(text) if text.startswith("[") else text.split(",")
        if isinstance(value, list):
            value = [h.strip().lower() for h in value if isinstance(h, str) and h.strip()]
        return value

    @field_validator("webhook_secret")
    @classmethod
    def _whsec(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not is_webhook_secret(value.get_secret_value()):
            raise ValueError(
                'must be "whsec_" followed by base64 of 24 to 64 random bytes, e.g. '
                "python -c \"import base64,os; print('whsec_'+base64.b64encode(os.urandom(32))"
                '.decode())"'
            )
        return value

    # --- Tracing (issue 27) ---
    # No settings of its own: OpenTelemetry's standard OTEL_* variables turn it on and
    # configure it (app/core/tracing.py; docs/service.md, "Tracing").

    # --- Honest reuse (issue 27) ---
    # How long an Idempotency-Key replays the job it made (from the job's creation): a
    # request with the key after that makes a new job, run on today's registry and
    # server, and the key moves to it (app/services/jobs.py). A retried CI step comes
    # within minutes; a result a day old is not one to hand back unasked.
    idempotency_key_ttl_s: float = Field(default=24 * 3600.0, gt=0)

    # --- Verdicts: the verdict store (issue 28, helper B) ---
    # What measured selection learned, in the database (app/services/verdicts.py): each
    # job's measured verdicts are stored, and a later measured job on a host of the same
    # CPU and onnxruntime decides the groups a fresh, confident verdict covers without
    # timing them. Shared: every tenant's jobs reuse every tenant's verdicts (they hold
    # op types, shape classes and timings, never a model's names or weights; a foreign
    # job's id is never shown); false: a tenant's jobs reuse only its own jobs' verdicts.
    verdicts_shared: bool = True
    # A verdict older than this is not reused (it stays listed and exported).
    verdict_max_age_days: float = Field(default=30.0, gt=0, le=36_500)
    # The newest fresh verdicts handed to a job's sandbox, at most (its verdicts.json).
    verdicts_prefetch_limit: int = Field(default=20_000, ge=0)
    # The verdicts one job may store, at most (the sandbox's output is capped here).
    verdicts_per_job_limit: int = Field(default=1000, ge=0)

    # --- Verdicts: the registry uses them (issue 28, helper C) ---
    # After a job's verdicts are stored, a pattern measured slower with confidence on a
    # machine class, in at least verdicts_auto_disable_min_jobs distinct jobs, is
    # disabled on that class (a rule by "auto", with the evidence; a person enables it
    # again from the dashboard or the API). Off: only people disable (docs/service.md,
    # "The registry uses them").
    verdicts_auto_disable: bool = False
    verdicts_auto_disable_min_jobs: int = Field(default=3, ge=1)


@lru_cache
def get_settings() -> Settings:
    return Settings()
