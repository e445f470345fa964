"""`autofusion keys`: create, list and revoke API keys directly in the database.

This is how the first key of a server started with `--require-api-keys` is made: it
needs access to the database, not to the API. Each command applies the migrations
first, so it works on a fresh database too. A key is printed once, on stdout alone (so
`KEY=$(autofusion keys create ...)` captures it); only its sha256 is stored.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from autofusion.app.cli._exit import EXIT_OK, EXIT_USAGE
from autofusion.app.cli.migrate import add_database_options, prepare_database, settings_from_args
from autofusion.app.core.db import session_scope
from autofusion.app.core.models import ApiKey, utcnow
from autofusion.app.services.auth import SCOPES, create_key
from autofusion.app.services.webhooks import (
    rotate_secret,
    set_default_url,
    tenant_settings,
    url_problem,
)

__all__ = ["add_parser", "run"]

_TENANT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "keys",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    create = actions.add_parser("create", help="create a key and print it (once)")
    create.add_argument("--tenant", required=True, help="tenant the key acts for (created if new)")
    create.add_argument(
        "--scopes",
        default="jobs:write",
        help=f"comma-separated, from {', '.join(SCOPES)} (default jobs:write)",
    )
    create.add_argument("--name", default="", help="a note: who or what uses the key")
    add_database_options(create)
    create.set_defaults(run=run, keys_action=_create)

    listing = actions.add_parser("list", help="list keys (never the keys themselves)")
    listing.add_argument("--tenant", help="only this tenant's keys")
    listing.add_argument("--json", action="store_true", help="print JSON")
    add_database_options(listing)
    listing.set_defaults(run=run, keys_action=_list)

    revoke = actions.add_parser("revoke", help="revoke a key by id (see `keys list`)")
    revoke.add_argument("key_id", type=int, metavar="ID")
    add_database_options(revoke)
    revoke.set_defaults(run=run, keys_action=_revoke)

    hook = actions.add_parser(
        "webhook",
        help="a tenant's webhook secret (printed) and default callback URL",
        description="Print the secret that signs the tenant's webhooks (made if it has "
        "none), on stdout alone; --rotate replaces it, --url sets the callback URL of its "
        "jobs that name none (its host must be in AUTOFUSION_WEBHOOK_ALLOWED_HOSTS).",
    )
    hook.add_argument("--tenant", required=True, help="the tenant (created if new)")
    url = hook.add_mutually_exclusive_group()
    url.add_argument("--url", help="the default callback URL of the tenant's jobs")
    url.add_argument("--no-url", action="store_true", help="remove the default callback URL")
    hook.add_argument("--rotate", action="store_true", help="make a new secret")
    add_database_options(hook)
    hook.set_defaults(run=run, keys_action=_webhook)


def _fail(message: str) -> int:
    sys.stderr.write(f"autofusion keys: {message}\n")
    return EXIT_USAGE


def run(args: argparse.Namespace) -> int:
    try:
        settings = settings_from_args(args)
        url = prepare_database(settings)
    except ValidationError as exc:
        return _fail(f"invalid settings:\n{exc}")
    except OperationalError as exc:
        return _fail(f"cannot open the database: {exc.orig}")
    return args.keys_action(args, url)


def _create(args: argparse.Namespace, url: str) -> int:
    if not _TENANT.fullmatch(args.tenant):
        return _fail(
            f"invalid tenant {args.tenant!r}: use up to 64 letters, digits, '.', '_' or '-'"
        )
    scopes = [s.strip() for s in args.scopes.split(",") if s.strip()]
    if not scopes:
        return _fail(f"--scopes is empty; choose from {', '.join(SCOPES)}")
    try:
        with session_scope(url) as session:
            token = create_key(session, args.tenant, scopes, name=args.name)
            newest = select(ApiKey.id).where(ApiKey.prefix == token[:11]).order_by(ApiKey.id.desc())
            key_id = session.scalars(newest).first()
    except ValueError as exc:
        return _fail(str(exc))
    sys.stderr.write(
        f"autofusion: created key {key_id} ({token[:11]}...) for tenant {args.tenant!r} "
        f"with scopes {','.join(sorted(set(scopes)))}; it is shown only now:\n"
    )
    sys.stdout.write(token + "\n")
    return EXIT_OK


def _key_row(key: ApiKey) -> dict:
    return {
        "id": key.id,
        "tenant": key.tenant_id,
        "prefix": key.prefix,
        "scopes": list(key.scopes),
        "name": key.name,
        "created_at": key.created_at.isoformat(),
        "revoked_at": key.revoked_at.isoformat() if key.revoked_at else None,
    }


def _list(args: argparse.Namespace, url: str) -> int:
    with session_scope(url) as session:
        query = select(ApiKey).order_by(ApiKey.id)
        if args.tenant:
            query = query.where(ApiKey.tenant_id == args.tenant)
        rows = [_key_row(k) for k in session.scalars(query)]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    if not rows:
        print("no keys")
        return EXIT_OK
    header = ("id", "tenant", "prefix", "scopes", "status", "created", "name")
    table = [
        (
            str(r["id"]),
            r["tenant"],
            r["prefix"] + "...",
            ",".join(r["scopes"]),
            "revoked" if r["revoked_at"] else "active",
            r["created_at"][:19],
            r["name"],
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in [header, *table]) for i in range(len(header))]
    for line in [header, *table]:
        print("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip())
    return EXIT_OK


def _revoke(args: argparse.Namespace, url: str) -> int:
    with session_scope(url) as session:
        key = session.get(ApiKey, args.key_id)
        if key is None:
            return _fail(f"there is no key {args.key_id}; see `autofusion keys list`")
        if key.revoked_at is None:
            key.revoked_at = utcnow()
        tenant, prefix = key.tenant_id, key.prefix
    sys.stderr.write(f"autofusion: revoked key {args.key_id} ({prefix}...) of tenant {tenant!r}\n")
    return EXIT_OK


def _webhook(args: argparse.Namespace, url: str) -> int:
    if not _TENANT.fullmatch(args.tenant):
        return _fail(
            f"invalid tenant {args.tenant!r}: use up to 64 letters, digits, '.', '_' or '-'"
        )
    settings = settings_from_args(args)
    if args.url is not None and (why := url_problem(args.url, settings.webhook_allowed_hosts)):
        return _fail(f"--url {why}")
    with session_scope(url) as session:
        if args.rotate:
            rotate_secret(session, args.tenant)
        if args.url is not None or args.no_url:
            set_default_url(session, args.tenant, None if args.no_url else args.url)
        public = tenant_settings(session, args.tenant, settings)
    where = public.default_url or "none (jobs name their callback_url)"
    sys.stderr.write(f"autofusion: tenant {args.tenant!r}: default callback URL {where}\n")
    if public.secret is None:
        sys.stderr.write(
            "autofusion: its webhooks are signed with the server's AUTOFUSION_WEBHOOK_SECRET\n"
        )
        return EXIT_OK
    sys.stderr.write("autofusion: its webhooks are signed with this secret:\n")
    sys.stdout.write(public.secret + "\n")
    return EXIT_OK
