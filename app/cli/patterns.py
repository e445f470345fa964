"""``autofusion patterns``: inspect the built-in patterns."""

from __future__ import annotations

import argparse

from autofusion.app.cli._exit import EXIT_OK
from autofusion.fusion_core import builtin_patterns, load_pattern_file


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("patterns")
    sub = p.add_subparsers(dest="patterns_command", required=True, metavar="ACTION")
    listing = sub.add_parser("list", help="show the built-in patterns")
    listing.add_argument("--pattern-file", action="append", default=[], help="also list these")
    listing.set_defaults(run=run_list)
    check = sub.add_parser("check", help="validate a pattern file without running it")
    check.add_argument("file")
    check.set_defaults(run=run_check)


def run_list(args: argparse.Namespace) -> int:
    patterns = builtin_patterns()
    for path in args.pattern_file:
        patterns += load_pattern_file(path)
    width = max(len(p.name) for p in patterns)
    print(f"{'name':<{width}}  priority  targets               rewriter")
    for p in sorted(patterns, key=lambda p: (-p.spec.priority, p.name)):
        targets = ",".join(p.spec.targets)
        print(f"{p.name:<{width}}  {p.spec.priority:>8}  {targets:<20}  {p.rewriter.name}")
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    patterns = load_pattern_file(args.file)
    for p in patterns:
        print(f"ok: {p.name} ({p.rewriter.name}; targets {','.join(p.spec.targets)})")
    return EXIT_OK
