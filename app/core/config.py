"""One ``Settings`` for the service, read from ``AUTOFUSION_*`` environment variables.

Embedded mode (the default) needs nothing set: SQLite, Celery over kombu's
``filesystem://`` transport and artifacts all live under ``data_dir``. Distributed mode
sets ``database_url`` (PostgreSQL), ``broker_url`` (Redis) and an S3 store.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings", "get_settings"]


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="AUTOFUSION_", extra="ignore")

    data_dir: Path = Path("data")
    # Empty means the embedded defaults under data_dir.
    database_url: str = ""
    broker_url: str = ""
    # Run a Celery worker thread inside the API process (embedded mode).
    embedded_worker: bool = True
    # Apply database migrations when the API starts (compose runs a one-shot instead).
    migrate_on_start: bool = True

    artifact_store: Literal["local", "s3"] = "local"
    s3_bucket: str = "autofusion"
    s3_endpoint_url: str | None = None
    s3_region: str | None = None

    # Auth: embedded on 127.0.0.1 may run without keys; anything else should not.
    require_api_keys: bool = False
    default_tenant: str = "default"

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
        return self.database_url or f"sqlite:///{(self.data_dir / 'autofusion.db').resolve()}"

    @property
    def resolved_broker_url(self) -> str:
        return self.broker_url or "filesystem://"

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
    # Slow clients: a body must arrive at min_body_rate_bytes_s once the first
    # body_rate_grace_s have passed, with no gap over body_idle_timeout_s and in
    # body_total_timeout_s at most; otherwise 408 (and an upload's folder is removed).
    min_body_rate_bytes_s: int = Field(default=1024, ge=0)
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
    # Scratch folders (data_dir/jobs, data_dir/downloads) and upload folders
    # (data_dir/uploads) untouched for this long whose process is gone are removed: at
    # worker start and every scratch_sweep_interval_s by the reaper, and at API start
    # (app/services/scratch.py).
    scratch_max_age_s: float = Field(default=3600.0, gt=0)
    scratch_sweep_interval_s: float = Field(default=300.0, gt=0)

    # Model work the API hands to a child process (issue 15, item 1): upload checks of
    # models over api_inline_check_bytes, and every pattern trial
    # (app/services/model_sandbox.py). Each child gets this wall clock (then its process
    # group is killed), CPU time and address space; at most api_sandbox_concurrency run
    # at once per API process, a request waits api_sandbox_queue_s for a free slot and
    # then answers 503 with Retry-After. A model over a limit answers 422.
    api_sandbox_time_limit_s: float = Field(default=60.0, gt=0)
    api_sandbox_cpu_limit_s: int = Field(default=60, ge=1)
    api_sandbox_memory_limit_mb: int = Field(default=6144, ge=256)
    api_sandbox_concurrency: int = Field(default=2, ge=1)
    api_sandbox_queue_s: float = Field(default=10.0, ge=0)
    # Uploaded models up to this size are checked in the API process (a few times this
    # in memory, no child to start); bigger ones in a child. 0: always in a child.
    api_inline_check_bytes: int = Field(default=64 * 1024**2, ge=0)

    # Upload validation caps (issue 15, item 5; app/services/model_checks.py): nodes in
    # all graphs, subgraphs and functions together, and how deep subgraphs (If/Loop/Scan
    # bodies) may nest. Over either: 422 naming the setting.
    max_model_nodes: int = Field(default=1_000_000, ge=1)
    max_graph_depth: int = Field(default=64, ge=1)


@lru_cache
def get_settings() -> Settings:
    return Settings()
