"""`autofusion serve`: run the API (and, in embedded mode, a worker) with uvicorn.

Flags override the `AUTOFUSION_*` environment, which overrides the defaults. With no
flags this is embedded mode: SQLite, Celery on kombu's `filesystem://` transport and
local artifacts under `--data-dir`, an in-process worker thread, migrations applied on
start. A Redis `--broker` turns the in-process worker off unless asked for: jobs then
run in separate `autofusion worker` processes.

This is the composition root of the service: ``service_app`` builds the API
(``app.main.create_app``, which imports no worker) and, in embedded mode, hands it the
worker thread and the reaper to run beside it.
"""

from __future__ import annotations

import argparse
import ipaddress
import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from autofusion.app.cli._exit import EXIT_OK, EXIT_USAGE
from autofusion.app.cli._protobuf import python_protobuf_refusal
from autofusion.app.core.config import Settings
from autofusion.app.core.logs import configure_logging
from autofusion.app.services.runtime_versions import runtime_version_refusal

if TYPE_CHECKING:
    from fastapi import FastAPI

__all__ = ["add_parser", "is_loopback", "run", "service_app", "settings_from_args"]

logger = logging.getLogger(__name__)


_EPILOG = """\
examples:
  autofusion serve                              embedded mode on http://127.0.0.1:8000
  autofusion serve --data-dir /srv/autofusion   the same, data elsewhere
  autofusion serve --host 0.0.0.0 --require-api-keys \\
      --database postgresql+psycopg://af:secret@db/autofusion --broker redis://redis:6379/0

Listening on anything but 127.0.0.1/localhost needs --require-api-keys (create keys with
`autofusion keys create`): a service reachable from the network without keys would run
anybody's models. --insecure-no-auth overrides this, for a network you trust entirely.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "serve",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    p.add_argument("--data-dir", type=Path, help="SQLite, queue and artifacts (default ./data)")
    p.add_argument("--database", metavar="URL", help="SQLAlchemy URL (default: SQLite in data dir)")
    p.add_argument("--broker", metavar="URL", help="Celery broker, e.g. redis://host:6379/0")
    p.add_argument(
        "--embedded-worker",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="run a worker thread in this process (default: on, off with a Redis broker)",
    )
    p.add_argument(
        "--require-api-keys",
        action="store_true",
        help="refuse requests without a valid API key",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow a non-loopback --host without --require-api-keys",
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["critical", "error", "warning", "info", "debug"],
    )
    p.set_defaults(run=run)


def is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a hostname: it may resolve to anything


def _env_sets(name: str) -> bool:
    # pydantic-settings matches environment names case-insensitively.
    return any(key.upper() == name for key in os.environ)


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Defaults < `AUTOFUSION_*` environment < command-line flags."""
    overrides: dict = {}
    if args.data_dir is not None:
        overrides["data_dir"] = args.data_dir
    if args.database is not None:
        overrides["database_url"] = args.database
    if args.broker is not None:
        overrides["broker_url"] = args.broker
    if args.embedded_worker is not None:
        overrides["embedded_worker"] = args.embedded_worker
    if args.require_api_keys:
        overrides["require_api_keys"] = True
    settings = Settings(**overrides)
    update: dict = {"data_dir": settings.data_dir.resolve()}
    if args.embedded_worker is None and not _env_sets("AUTOFUSION_EMBEDDED_WORKER"):
        # A server broker means separate `autofusion worker` processes take the jobs.
        update["embedded_worker"] = settings.is_embedded_broker
    return settings.model_copy(update=update)


def _refusal(args: argparse.Namespace, settings: Settings) -> str | None:
    if is_loopback(args.host) or settings.require_api_keys or args.insecure_no_auth:
        return None
    return (
        f"refusing to listen on {args.host} without API keys: anyone who can reach it "
        "could run jobs and change the pattern registry.\n"
        "  add --require-api-keys (and create a key: autofusion keys create --tenant NAME "
        "--scopes jobs:write),\n"
        "  or listen on 127.0.0.1 only, or pass --insecure-no-auth if this network is "
        "trusted entirely"
    )


def _describe(args: argparse.Namespace, settings: Settings) -> str:
    database = "SQLite in " + str(settings.data_dir) if not settings.database_url else "database"
    broker = "filesystem queue" if settings.is_embedded_broker else "broker"
    worker = (
        "in-process worker"
        if settings.embedded_worker
        else "no in-process worker (run `autofusion worker`)"
    )
    keys = "API keys required" if settings.require_api_keys else "no API keys needed"
    host = f"[{args.host}]" if ":" in args.host else args.host
    return f"autofusion: serving http://{host}:{args.port} ({database}, {broker}, {worker}; {keys})"


def service_app(settings: Settings) -> FastAPI:
    """The API for these settings, with the embedded worker beside it when they ask for one."""
    # Imported here: `autofusion --help` and the client commands load neither API nor worker.
    from autofusion.app.main import create_app

    companion = (lambda: _embedded_worker(settings)) if settings.embedded_worker else None
    return create_app(settings, companion=companion)


@contextmanager
def _embedded_worker(settings: Settings) -> Iterator[object]:
    """A Celery worker thread and the reaper in this process, from start to shutdown;
    yields the worker, which answers ``/readyz`` for itself (``problem()``)."""
    from autofusion.worker.celery_app import make_celery
    from autofusion.worker.embedded import EmbeddedWorker

    embedded = EmbeddedWorker(settings, make_celery(settings))
    embedded.start()
    try:
        yield embedded
    finally:
        embedded.stop()


def run(args: argparse.Namespace) -> int:
    protobuf = python_protobuf_refusal("serve")
    if protobuf:
        sys.stderr.write(protobuf)
        return EXIT_USAGE
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        sys.stderr.write(f"autofusion serve: invalid settings:\n{exc}\n")
        return EXIT_USAGE
    refusal = _refusal(args, settings)
    if refusal:
        sys.stderr.write(f"autofusion serve: {refusal}\n")
        return EXIT_USAGE
    # One handler on the root for everything from here on (these lines, the app's, the
    # worker's, uvicorn's own and its access lines: log_config=None below), JSON or
    # text, each line with its request id.
    configure_logging(args.log_level, settings.log_format)
    refusal = runtime_version_refusal()  # an older onnx or onnxruntime fails jobs obscurely
    if refusal:
        logger.error("autofusion serve: %s", refusal)
        return EXIT_USAGE
    if not settings.embedded_worker and settings.is_embedded_broker:
        logger.warning(
            "autofusion serve: no in-process worker: jobs wait until an `autofusion worker` "
            "with the same data dir (%s) takes them",
            settings.data_dir,
        )
    if args.insecure_no_auth and not is_loopback(args.host) and not settings.require_api_keys:
        logger.warning(
            "autofusion serve: listening on %s without API keys "
            "(--insecure-no-auth): anyone who can reach this port can run jobs",
            args.host,
        )
    logger.info("%s", _describe(args, settings))

    import uvicorn  # imported late: `autofusion --help` stays fast

    uvicorn.run(
        service_app(settings),
        host=args.host,
        port=args.port,
        log_level=args.log_level,
        log_config=None,
        server_header=False,
        # uvicorn's own bounds: idle keep-alive connections close after 5 s, a request's
        # headers may not pass 16 KiB, and a shutdown waits 30 s at most for requests
        # in flight. Bodies are bounded by the app (app/api/limits.py).
        timeout_keep_alive=5,
        h11_max_incomplete_event_size=16 * 1024,
        timeout_graceful_shutdown=30,
    )
    return EXIT_OK
