"""`autofusion migrate`: prepare the storage a service needs, then exit.

Applies the database migrations (Alembic, to the latest revision) and, when artifacts
go to S3, creates the bucket if it is missing. `autofusion serve` does the migrations
itself on start in embedded mode; a cluster runs this once (docker-compose's one-shot
`migrate` service) and starts its API and workers with migrations off.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pydantic import ValidationError
from sqlalchemy.exc import OperationalError

from autofusion.app.cli._exit import EXIT_OK, EXIT_USAGE
from autofusion.app.core.config import Settings
from autofusion.app.migrate import upgrade

__all__ = ["add_database_options", "add_parser", "ensure_bucket", "run", "settings_from_args"]


def add_database_options(p: argparse.ArgumentParser) -> None:
    """`--database URL | --data-dir DIR`, shared by the commands that open the database."""
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--database", metavar="URL", help="SQLAlchemy URL (default: AUTOFUSION_DATABASE_URL)"
    )
    where.add_argument(
        "--data-dir", type=Path, help="use the SQLite database of this data dir (default ./data)"
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Defaults < `AUTOFUSION_*` environment < `--database` / `--data-dir`."""
    overrides: dict = {}
    if args.database is not None:
        overrides["database_url"] = args.database
    if args.data_dir is not None:
        # An explicit data dir means its SQLite file, whatever the environment says.
        overrides["data_dir"] = args.data_dir
        overrides["database_url"] = ""
    return Settings(**overrides)


def prepare_database(settings: Settings) -> str:
    """Apply the migrations; return the database URL."""
    if not settings.database_url:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
    url = settings.resolved_database_url
    upgrade(url)
    return url


def ensure_bucket(settings: Settings) -> bool:
    """Create the S3 bucket if it does not exist. True if it was created."""
    import boto3
    from botocore.exceptions import ClientError

    client = boto3.client("s3", **settings.s3_client_options())
    try:
        client.head_bucket(Bucket=settings.s3_bucket)
        return False
    except ClientError as exc:
        if exc.response.get("Error", {}).get("Code") not in ("404", "NoSuchBucket"):
            raise
    client.create_bucket(Bucket=settings.s3_bucket)
    return True


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "migrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_database_options(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
    except ValidationError as exc:
        sys.stderr.write(f"autofusion migrate: invalid settings:\n{exc}\n")
        return EXIT_USAGE
    try:
        prepare_database(settings)
    except OperationalError as exc:
        sys.stderr.write(f"autofusion migrate: cannot open the database: {exc.orig}\n")
        return EXIT_USAGE
    sys.stderr.write("autofusion: database schema is up to date\n")
    if settings.artifact_store == "s3":
        created = ensure_bucket(settings)
        state = "created" if created else "exists"
        sys.stderr.write(f"autofusion: S3 bucket {settings.s3_bucket!r} {state}\n")
    return EXIT_OK
