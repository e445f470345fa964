"""`autofusion config show`: the settings this machine's service would run with.

Read as `autofusion serve` and `autofusion worker` read them (defaults < `.env` file and
secrets directory < the environment), one `AUTOFUSION_NAME=value` a line, each marked
`# default` when nobody set it; secrets (the database and broker URLs, the S3 keys, the
dashboard's session secret) print as `**********`, and the database and broker the
service would use are named with their passwords replaced by `***`. `--json` prints the
same as one object.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from pydantic import ValidationError

from autofusion.app.cli._exit import EXIT_OK, EXIT_USAGE
from autofusion.app.core.config import Settings, redact_url
from autofusion.fusion_core.errors import describe_fields, field_errors

__all__ = ["add_parser", "effective_settings", "run"]


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "config",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = actions.add_parser("show", help="print the effective settings, secrets masked")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def effective_settings(settings: Settings) -> dict[str, Any]:
    """``{"settings": {VARIABLE: value}, "defaults": [VARIABLE...], "database", "broker"}``
    with every secret masked (pydantic's SecretStr prints as ``**********``)."""
    values = settings.model_dump(mode="json")
    unset = set(Settings.model_fields) - settings.model_fields_set
    return {
        "settings": {f"AUTOFUSION_{name.upper()}": values[name] for name in sorted(values)},
        "defaults": sorted(f"AUTOFUSION_{name.upper()}" for name in unset),
        "database": redact_url(settings.resolved_database_url),
        "broker": redact_url(settings.resolved_broker_url),
    }


def run(args: argparse.Namespace) -> int:
    try:
        shown = effective_settings(Settings())
    except ValidationError as exc:
        details = describe_fields(field_errors(exc, default="settings"))
        sys.stderr.write(f"autofusion config: error: invalid settings: {details}\n")
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(json.dumps(shown, indent=1) + "\n")
        return EXIT_OK
    defaults = set(shown["defaults"])
    for name, value in shown["settings"].items():
        text = value if isinstance(value, str) else json.dumps(value)
        sys.stdout.write(f"{name}={text}{'  # default' if name in defaults else ''}\n")
    sys.stdout.write(f"# database: {shown['database']}\n# broker: {shown['broker']}\n")
    return EXIT_OK
