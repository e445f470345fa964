"""`autofusion verdicts`: the server's verdict store, what measured selection learned.

  autofusion verdicts list [FILTERS] [--all] [--json]   the verdicts, newest first
  autofusion verdicts export [FILTERS] [-o FILE]        a verdicts file (default: stdout)
  autofusion verdicts import FILE [--json]              store a file's verdicts (admin key)

FILTERS: --pattern NAME, --verdict faster|level|slower, --signature SHA256,
--machine-key SHA256, --onnxruntime VERSION, --cpu MODEL, --since TIME (ISO 8601),
--source measured|imported. Export a trusted server's store and import it into a new
one to seed it; `autofusion optimize --verdicts FILE` reuses an export locally.
--server and --api-key come from AUTOFUSION_SERVER and AUTOFUSION_API_KEY by default.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from autofusion.app.cli._client import (
    Client,
    ClientError,
    add_server_options,
    exit_codes,
    with_client,
)
from autofusion.app.cli._exit import EXIT_BAD_INPUT, EXIT_OK, EXIT_USAGE, epilog
from autofusion.app.client import (
    export_verdicts,
    import_verdicts,
    list_verdicts,
    verdicts_query,
)

__all__ = ["add_parser"]

VERDICTS = {"faster": "faster", "level": "no measurable change", "slower": "slower"}
_SHOWN_REASONS = 20  # an import's skipped verdicts printed; --json has them all


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "verdicts",
        description=__doc__,
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="verdicts_command", required=True, metavar="ACTION")
    listing = _action(actions, "list", "the verdicts, newest measurement first", _run_list)
    _add_filters(listing)
    listing.add_argument("--limit", type=int, default=50, help="verdicts per page (default 50)")
    listing.add_argument("--all", action="store_true", help="every page, not only the first")
    listing.add_argument("--json", action="store_true", help="print the verdicts as JSON")
    export = _action(actions, "export", "the verdicts as a verdicts file", _run_export)
    _add_filters(export)
    export.add_argument("--limit", type=int, help="the newest this many (default: the server's)")
    export.add_argument("-o", "--output", type=Path, help="write it here (default: stdout)")
    imported = _action(actions, "import", "store a verdicts file's verdicts", _run_import)
    imported.add_argument("file", type=Path, metavar="FILE", help="a verdicts file (an export)")
    imported.add_argument("--json", action="store_true", help="print the counts as JSON")


def _action(actions: argparse._SubParsersAction, name: str, help_line: str, run: Any):
    action = actions.add_parser(name, help=help_line, description=help_line)
    add_server_options(action)
    action.set_defaults(run=lambda args: with_client(args, "verdicts", lambda c: run(c, args)))
    return action


def _time(text: str) -> datetime:
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not an ISO 8601 time (e.g. 2026-12-01 or 2026-12-01T12:00:00Z)"
        ) from None


def _add_filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--pattern", metavar="NAME", help="one pattern's verdicts")
    p.add_argument("--verdict", choices=tuple(VERDICTS), help="how they measured")
    p.add_argument("--signature", metavar="SHA256", help="one region signature's")
    p.add_argument("--machine-key", metavar="SHA256", help="one machine class's")
    p.add_argument("--onnxruntime", metavar="VERSION", help="measured with this onnxruntime")
    p.add_argument("--cpu", metavar="MODEL", help="measured on this CPU model")
    p.add_argument("--since", type=_time, metavar="TIME", help="measured at or after (UTC)")
    p.add_argument("--source", choices=("measured", "imported"), help="measured here, or imported")


def _filters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "pattern": args.pattern,
        "verdict": VERDICTS.get(args.verdict) if args.verdict else None,
        "signature": args.signature,
        "machine_key": args.machine_key,
        "onnxruntime": args.onnxruntime,
        "cpu": args.cpu,
        "since": args.since,
        "source": args.source,
    }


def _run_list(client: Client, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ClientError(f"--limit must be 1 or more, not {args.limit}", EXIT_USAGE)
    params = verdicts_query(_filters(args), page_size=args.limit)
    items: list[dict] = []
    with exit_codes():
        while True:
            page = list_verdicts(client.transport, params)
            items += page.get("items") or []
            token = page.get("next_page_token")
            if not (args.all and token):
                break
            params["page_token"] = token
    if args.json:
        print(json.dumps(items, indent=2))
        return EXIT_OK
    print(_HEADER)
    for v in items:
        print(_line(v))
    if not items:
        sys.stderr.write("autofusion verdicts: no verdicts\n")
    return EXIT_OK


_HEADER = f"{'id':>7} {'measured':<19} {'verdict':<9} {'ratio':<21} {'runs':>5} {'job':<36} pattern"


def _line(v: dict) -> str:
    ratio = v.get("ratio") or {}
    word = {"no measurable change": "level"}.get(ratio.get("verdict"), ratio.get("verdict"))
    low, high = ratio.get("low", 0), ratio.get("high", 0)
    interval = f"{ratio.get('median', 0):.3f} ({low:.3f}-{high:.3f})"
    when = str(v.get("measured_at") or "")[:19].replace("T", " ")
    job = v.get("job_id") or ("(imported)" if v.get("source") == "imported" else "(hidden)")
    return (
        f"{v.get('id', '?'):>7} {when:<19} {word or '?':<9} {interval:<21} "
        f"{ratio.get('runs', 0):>5} {job:<36} {v.get('pattern', '')}"
    )


def _run_export(client: Client, args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit < 0:
        raise ClientError(f"--limit must be 0 or more, not {args.limit}", EXIT_USAGE)
    params = verdicts_query(_filters(args), limit=args.limit)
    with exit_codes():
        document = export_verdicts(client.transport, params)
    text = json.dumps(document, indent=1) + "\n"
    written, total = len(document.get("verdicts") or []), document.get("total")
    if args.output:
        args.output.write_text(text, encoding="utf-8")
        sys.stderr.write(f"autofusion verdicts: wrote {written} verdicts to {args.output}\n")
    else:
        sys.stdout.write(text)
    if isinstance(total, int) and total > written:
        sys.stderr.write(
            f"autofusion verdicts: {total} verdicts match, the file holds the newest "
            f"{written}; export the rest with --since or another filter\n"
        )
    return EXIT_OK


def _run_import(client: Client, args: argparse.Namespace) -> int:
    try:
        document = json.loads(args.file.read_text(encoding="utf-8"))
    except OSError as exc:
        why = exc.strerror or exc
        raise ClientError(f"cannot read {args.file}: {why}", EXIT_BAD_INPUT) from None
    except ValueError as exc:
        raise ClientError(f"{args.file} is not JSON: {exc}", EXIT_BAD_INPUT) from None
    if not isinstance(document, dict):
        raise ClientError(
            f"{args.file} is not a verdicts file (`autofusion verdicts export` writes one)",
            EXIT_BAD_INPUT,
        )
    with exit_codes():
        counts = import_verdicts(client.transport, document)
    if args.json:
        print(json.dumps(counts, indent=2))
        return EXIT_OK
    skipped = counts.get("skipped") or []
    print(f"imported:   {counts.get('imported', 0)}")
    print(f"duplicates: {counts.get('duplicates', 0)} (stored already)")
    print(f"skipped:    {len(skipped)} (invalid)")
    for reason in skipped[:_SHOWN_REASONS]:
        print(f"  {reason}")
    if len(skipped) > _SHOWN_REASONS:
        print(f"  ... and {len(skipped) - _SHOWN_REASONS} more (--json lists them all)")
    return EXIT_OK
