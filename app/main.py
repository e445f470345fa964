"""The FastAPI application: thin routes over services, problem+json errors.

``create_app(settings)`` wires everything; on start it applies migrations and seeds the
built-in patterns and strategies into the registry. It publishes jobs by task name
(``app.core.queue``) and imports no worker: the API process never does model work. What
else runs in its process (in embedded mode the worker thread and the reaper) is the
composition root's choice, ``app/cli/serve.py``, handed in as ``companion``.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager, ExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline
from sqlalchemy.exc import IntegrityError

from autofusion.app.api.limits import BodyLimits
from autofusion.app.api.openapi_contract import install_openapi
from autofusion.app.api.problems import install_problem_handlers
from autofusion.app.api.request_ids import RequestIdMiddleware
from autofusion.app.api.request_metrics import install_metrics
from autofusion.app.api.routes import (
    health,
    info,
    jobs,
    metrics,
    pattern_rules,
    patterns,
    strategies,
    uploads,
    verdicts,
    webhooks,
)
from autofusion.app.core import tracing
from autofusion.app.core.config import Settings, get_settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.queue import publish_job, queue_app
from autofusion.app.migrate import upgrade
from autofusion.app.services.artifacts import make_store
from autofusion.app.services.registry import sync_builtins
from autofusion.app.services.runtime_versions import check_runtime_versions
from autofusion.app.services.sandbox_policy import prepare_data_dir
from autofusion.app.services.scratch import ScratchSweeper
from autofusion.app.services.strategies import seed_strategies
from autofusion.app.services.uploads import UploadSlots
from autofusion.app.ui import install_ui

__all__ = ["Companion", "create_app"]

# Something that runs beside the API in its process from start to shutdown (entered once
# the database is ready, exited after the requests): the embedded worker and its reaper.
Companion = Callable[[], AbstractContextManager[object]]

logger = logging.getLogger(__name__)

DOCS_ASSETS = "/docs/assets"  # Swagger UI's files
# The API's routes, a module each (issue 28 added the verdict store, and the patterns
# disabled per machine class).
ROUTE_MODULES = (
    health, metrics, info, jobs, uploads, patterns, strategies, webhooks, verdicts,
    pattern_rules,
)  # fmt: skip


def _sync_builtins(url: str) -> None:
    """This release's built-in patterns into the registry (new ones added, unedited ones
    updated, ones it no longer ships retired: ``sync_builtins``)."""
    try:
        with session_scope(url) as session:
            synced = sync_builtins(session)
    except IntegrityError:  # another process of the service inserted them first
        logger.info("built-in patterns: synced by another process")
        return
    if any(synced):
        logger.info(
            "built-in patterns: %d added to the registry, %d updated, %d retired "
            "(no longer shipped)",
            *synced,
        )


def _telemetry() -> dict[str, Any] | None:
    """FastAPI's own request spans (the HTTP server span, which continues a client's W3C
    ``traceparent``) on the service's tracer provider while tracing is on
    (``app.core.tracing``); its metrics and logs stay off (Prometheus and the log lines
    have them). Off: FastAPI's defaults, which trace nothing without a provider."""
    provider = tracing.tracer_provider()
    if provider is None:
        return None
    return {
        "tracer_provider": provider,
        "metrics": False,
        "logs": False,
        "operation_spans": False,  # one span a request: the trace reads as the job's story
        "auto_configure": False,
    }


def create_app(settings: Settings | None = None, *, companion: Companion | None = None) -> FastAPI:
    settings = settings or get_settings()
    if settings.embedded_worker and companion is None:
        logger.warning(
            "embedded_worker is on but this app was built without a worker: jobs wait for "
            "an `autofusion worker` (autofusion.app.cli.serve.service_app adds the embedded one)"
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        check_runtime_versions()  # an onnx(runtime) too old: one log line, and no start
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        # Upload folders, download copies and half-written blobs of a killed process: now
        # and every scratch_sweep_interval_s (embedded and distributed alike).
        sweeper = ScratchSweeper.for_api(settings)
        sweeper.run_due()
        app.state.sweeper = sweeper
        if settings.migrate_on_start:
            upgrade(settings.resolved_database_url)
        _sync_builtins(settings.resolved_database_url)
        with session_scope(settings.resolved_database_url) as session:
            seed_strategies(session)
        celery = queue_app(settings)
        app.state.celery = celery
        app.state.enqueue = lambda job_id: publish_job(celery, job_id)
        # Last: the database file and the broker's folder exist by now. Sandboxes of their
        # own user may pass through data_dir to their folder, and see nothing else.
        prepare_data_dir(settings, "api")
        with ExitStack() as beside:
            if companion is not None:  # what it yields may answer /readyz (LocalWorker)
                app.state.local_worker = beside.enter_context(companion())
            sweeper.start()
            try:
                yield
            finally:
                sweeper.stop()

    # /docs (Swagger UI) loads its files from this server (fastapi-offline ships them),
    # never from a CDN: it works offline. No /redoc: ReDoc fetches its logo from its CDN.
    app = FastAPIOffline(
        title="autofusion",
        version="0.1.0",
        summary="Automatic operator fusion for ONNX models, as a service.",
        lifespan=lifespan,
        redoc_url=None,
        static_url=DOCS_ASSETS,
        telemetry=_telemetry(),
    )
    app.state.settings = settings
    app.state.store = make_store(settings)
    app.state.upload_slots = UploadSlots.from_settings(settings)
    install_problem_handlers(app)
    for module in ROUTE_MODULES:
        app.include_router(module.router)
    install_openapi(app)  # the published contract: problems, headers, links
    install_ui(app)  # the dashboard under /ui (not in the OpenAPI document)
    app.add_middleware(BodyLimits, settings=settings)  # every body: size and time limits
    install_metrics(app)  # outside BodyLimits: its 413s and 408s are counted and timed too
    app.add_middleware(RequestIdMiddleware)  # outermost: every response carries X-Request-ID
    return app
