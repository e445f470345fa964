"""``autofusion optimize``: run the fusion core locally, no server needed."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import onnx

from app.cli._exit import EXIT_CHECK_FAILED, EXIT_OK
from fusion_core import OptimizeConfig, load_pattern_file, optimize, save_model
from fusion_core.catalog import parse_pattern_text
from fusion_core.config import CheckOptions
from fusion_core.errors import ConfigError, PatternError
from fusion_core.report import build_report, format_markdown, format_summary, render_html


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("optimize", help="fuse a model and check the result")
    p.add_argument("model", help="input .onnx file (external data next to it)")
    p.add_argument("-o", "--output", required=True, help="where to write the fused model")
    p.add_argument("--target", choices=["generic", "onnxruntime"], default="generic")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--patterns", help="only these patterns, comma-separated")
    which.add_argument("--exclude", help="all patterns but these, comma-separated")
    p.add_argument("--pattern-file", action="append", default=[], help="extra patterns (YAML/JSON)")
    p.add_argument("--report", help="also write the report as JSON to this file")
    p.add_argument("--html", help="also write the report as one self-contained HTML page")
    p.add_argument("--markdown", help="also write a Markdown summary (for CI logs)")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    p.add_argument("--rtol", type=float, default=CheckOptions().rtol)
    p.add_argument("--atol", type=float, default=CheckOptions().atol)
    p.add_argument("--samples", type=int, default=CheckOptions().samples)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=run)


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


def run(args: argparse.Namespace) -> int:
    extra = []
    for path in args.pattern_file:
        load_pattern_file(path)  # compile once here so errors name the file
        extra += parse_pattern_text(Path(path).read_text(encoding="utf-8"), path)
    try:
        config = OptimizeConfig(
            target=args.target,
            patterns=_names(args.patterns),
            exclude=_names(args.exclude) or [],
            extra_patterns=extra,
            check=CheckOptions(
                enabled=not args.no_check,
                rtol=args.rtol,
                atol=args.atol,
                samples=args.samples,
                seed=args.seed,
            ),
        )
    except ValueError as exc:
        raise ConfigError(f"invalid options: {exc}") from None
    result = optimize(args.model, config)
    save_model(result.model, args.output)
    report = build_report(result, model=args.model, output=args.output, config=config)
    _write_renderings(args, report)
    print(format_summary(report))
    if result.check is not None and not result.check.passed:
        sys.stderr.write("autofusion: the fused model does not match the original\n")
        return EXIT_CHECK_FAILED
    return EXIT_OK


def _write_renderings(args: argparse.Namespace, report: dict[str, Any]) -> None:
    if args.report:
        _write(args.report, json.dumps(report, indent=2) + "\n")
    if args.markdown:
        _write(args.markdown, format_markdown(report))
    if args.html:
        # Only the graphs are drawn: leave the weights on disk.
        original = onnx.load(args.model, load_external_data=False)
        fused = onnx.load(args.output, load_external_data=False)
        _write(args.html, render_html(report, original=original, fused=fused))


def _write(path: str, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")


__all__ = ["add_parser", "run", "PatternError"]
