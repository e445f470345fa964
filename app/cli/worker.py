"""``autofusion worker``: a Celery worker process for the job queue, plus the reaper.

Settings come from ``AUTOFUSION_*`` environment variables; the flags override them.
Each job runs in a sandboxed child process (time and memory limits), so a model that
crashes onnxruntime or exhausts memory fails its job, not this worker.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from pydantic import ValidationError

from autofusion.app.cli._exit import EXIT_USAGE
from autofusion.app.cli._protobuf import python_protobuf_refusal
from autofusion.app.core.config import Settings, redact_url
from autofusion.app.core.logs import configure_logging
from autofusion.app.services.runtime_versions import runtime_version_refusal
from autofusion.fusion_core.errors import describe_fields, field_errors

__all__ = ["add_parser", "run"]

logger = logging.getLogger(__name__)


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "worker",
        description="Run a Celery worker for the job queue, plus the lease reaper. Settings "
        "come from AUTOFUSION_* environment variables; these flags override them.",
    )
    p.add_argument("--concurrency", type=_positive, default=1, help="jobs run at once (default: 1)")
    p.add_argument(
        "--pool",
        choices=["prefork", "solo", "threads"],
        default="prefork",
        help="Celery pool: prefork (default) runs jobs in forked processes",
    )
    p.add_argument("--database", help="database URL (default: AUTOFUSION_DATABASE_URL)")
    p.add_argument("--broker", help="broker URL, e.g. redis://host:6379/0 (AUTOFUSION_BROKER_URL)")
    p.add_argument("--data-dir", help="scratch space and local artifacts (AUTOFUSION_DATA_DIR)")
    p.add_argument(
        "--loglevel", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO", type=str.upper
    )
    p.set_defaults(run=run)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def load_settings(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with the flags that were given on top."""
    flags = {"database_url": args.database, "broker_url": args.broker, "data_dir": args.data_dir}
    return Settings(**{key: value for key, value in flags.items() if value is not None})


def run(args: argparse.Namespace) -> int:
    protobuf = python_protobuf_refusal("worker")
    if protobuf:
        sys.stderr.write(protobuf)
        return EXIT_USAGE
    try:
        settings = load_settings(args)
    except ValidationError as exc:
        details = describe_fields(field_errors(exc, default="settings"))
        sys.stderr.write(f"autofusion worker: error: invalid settings: {details}\n")
        return EXIT_USAGE
    # JSON or text (AUTOFUSION_LOG_FORMAT), each line of a job with its request id and job id.
    configure_logging(args.loglevel, settings.log_format)
    refusal = runtime_version_refusal()  # an older onnx or onnxruntime fails jobs obscurely
    if refusal:
        logger.error("autofusion worker: %s", refusal)
        return EXIT_USAGE
    return _start(settings, args)


def _start(settings: Settings, args: argparse.Namespace) -> int:
    # Imported here: the other commands need neither Celery nor the worker.
    from celery.signals import worker_process_init, worker_ready

    from autofusion.app.core.db import get_engine
    from autofusion.app.services.artifacts import make_store
    from autofusion.app.services.sandbox_policy import prepare_data_dir
    from autofusion.app.services.worker_health import WorkerIdentity
    from autofusion.worker.celery_app import QUEUE, make_celery
    from autofusion.worker.heartbeat import Heartbeat
    from autofusion.worker.reaper import Reaper
    from autofusion.worker.tasks import enqueue_job

    settings.data_dir.mkdir(parents=True, exist_ok=True)
    try:
        prepare_data_dir(settings, "worker")  # sandboxes of their own user see their folder only
    except ValueError as exc:
        sys.stderr.write(f"autofusion worker: error: {exc}\n")
        return 2
    celery = make_celery(settings)
    celery.conf.autofusion_store = make_store(settings)
    reaper = Reaper(settings, lambda job_id: enqueue_job(celery, job_id))
    # /readyz and the dashboard see this worker alive while its row is fresh.
    heartbeat = Heartbeat(settings, WorkerIdentity(mode="distributed", slots=args.concurrency))

    def fresh_connections(**_) -> None:
        # A forked pool process must not share the parent's database connections.
        get_engine(settings.resolved_database_url).dispose(close=False)

    worker_process_init.connect(fresh_connections, weak=False)
    # Celery warns about any worker running as root. Here root is by design: it is what lets
    # each sandbox drop to its own unprivileged user (sandbox_policy says which, above),
    # and the queue accepts JSON only, never pickle, which is what the warning is about.
    warnings.filterwarnings("ignore", message="You're running the worker with superuser")
    worker_ready.connect(lambda **_: reaper.start(), weak=False)
    worker_ready.connect(lambda **_: heartbeat.start(), weak=False)
    worker = celery.Worker(
        pool=args.pool,
        concurrency=args.concurrency,
        loglevel=args.loglevel,
        queues=[QUEUE],
        without_mingle=True,
        without_gossip=True,
        # Celery's banner only at debug level: the line below says what a user needs.
        quiet=str(args.loglevel).upper() != "DEBUG",
    )
    logger.info(
        "worker: broker %s, %s pool x%d, time limit %d s, memory limit %d MB",
        redact_url(settings.resolved_broker_url),
        args.pool,
        args.concurrency,
        settings.job_time_limit_s,
        settings.job_memory_limit_mb,
    )
    try:
        worker.start()
    finally:
        heartbeat.stop()
        reaper.stop()
    return worker.exitcode or 0
