"""``autofusion optimize``: run the fusion core locally, no server needed."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

import onnx
from google.protobuf.message import DecodeError

from autofusion.app.cli._exit import EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE
from autofusion.app.cli._progress import PhaseProgress, wanted
from autofusion.fusion_core import OptimizeConfig, RunFiles, load_pattern_file
from autofusion.fusion_core import run as run_files
from autofusion.fusion_core.catalog import parse_pattern_text
from autofusion.fusion_core.config import (
    SELECTIONS,
    CheckOptions,
    MeasureOptions,
    read_strategy_file,
)
from autofusion.fusion_core.errors import ConfigError, ModelLoadError, PatternError
from autofusion.fusion_core.profiling.verdicts import read_verdicts
from autofusion.fusion_core.report import fallback_line, format_summary
from autofusion.fusion_core.targets import TARGET_NAMES
from autofusion.fusion_core.validate import ORIGINAL_CANNOT_RUN, describe_failure, load_inputs

# Measured selection's local verdict store: what it measured, by region signature and
# machine class (fusion_core reads no environment, so the CLI picks the folder).
DEFAULT_MEASURE_CACHE = (
    Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "autofusion" / "measured"
)


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("optimize")
    for add in (_files_and_patterns, _check_options, _selection_options, _measure_options):
        add(p)
    p.set_defaults(run=run, default_of=p.get_default)


def _files_and_patterns(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", help="input .onnx file (external data next to it)")
    p.add_argument("-o", "--output", required=True, help="where to write the fused model")
    p.add_argument("--target", choices=TARGET_NAMES, default="generic")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--patterns", help="only these patterns, comma-separated")
    which.add_argument("--exclude", help="all patterns but these, comma-separated")
    p.add_argument("--pattern-file", action="append", default=[], help="extra patterns (YAML/JSON)")
    p.add_argument("--report", help="also write the report as JSON to this file")
    p.add_argument("--html", help="also write the report as one self-contained HTML page")
    p.add_argument("--markdown", help="also write a Markdown summary (for CI logs)")
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime comparison")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="show the phases on stderr as they run (default: when stderr is a terminal)",
    )
    p.add_argument(
        "--strict",
        action="store_true",
        help="a failed check fails the run (exit 1, nothing written); by default it falls "
        "back to the largest set of fusions that passes and exits 0 with a warning",
    )
    p.add_argument(
        "--keep-failed",
        action="store_true",
        help="with --strict: write the fused model even when the check fails",
    )


def _check_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rtol", type=float, default=CheckOptions().rtol)
    p.add_argument("--atol", type=float, default=CheckOptions().atol)
    p.add_argument("--samples", type=int, default=CheckOptions().samples)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME=V[,NAME=V...]",
        help="a shape profile for the check (values of symbolic dims); repeat for several",
    )
    p.add_argument(
        "--inputs", help="check with these inputs: a .npz file or an ONNX test-data folder"
    )
    p.add_argument(
        "--upgrade-opset",
        type=int,
        metavar="N",
        help="convert the model to opset N first (onnx's version converter), so fusions "
        "may emit newer ops (HardSwish: 14); never downgrades",
    )
    p.add_argument(
        "--progressive",
        action="store_true",
        help="fuse in checked stages and roll back only the fusions that break the check",
    )
    p.add_argument(
        "--precision",
        choices=["fp32", "fp16"],
        default="fp32",
        help="fp16: flag fused regions whose values leave float16's range",
    )


def _selection_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--profile",
        action="store_true",
        help="measure both models in onnxruntime (latency, per-op times) into the report",
    )
    p.add_argument(
        "--selection",
        choices=SELECTIONS,
        default="priority",
        help="choose among overlapping fusions by pattern priority or by predicted gain; "
        "measured: priority proposes, then keep only what measures faster on this machine",
    )
    p.add_argument(
        "--target-profile",
        default="cpu",
        help="cost model hardware: cpu, cpu-kernels, gpu, or a file from `autofusion calibrate`",
    )
    p.add_argument(
        "--value-info",
        choices=["all", "none"],
        help="what the written model declares of its intermediate values: all their "
        "inferred types and shapes, or none (default: what the target profile says; cpu: none)",
    )
    p.add_argument("--cost-threshold", type=float, help="minimum predicted speedup ratio")
    p.add_argument("--memory-limit", type=int, help="maximum fused working set, bytes")
    p.add_argument(
        "--strategy",
        metavar="FILE",
        help="a strategy (YAML/JSON, the document POST /v1/strategies takes): patterns, "
        "selection, switches, stages...; options given here override it",
    )


def _measure_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--measure",
        action="store_true",
        help="measured selection on top of --selection: time each group of fusions on this "
        "machine (onnxruntime, ORT_ENABLE_ALL) and keep it only when it is faster",
    )
    measure = MeasureOptions()
    p.add_argument(
        "--measure-budget", type=float, default=measure.budget_s, metavar="SECONDS",
        help=f"measured selection: wall seconds of measuring (default {measure.budget_s:g})",
    )  # fmt: skip
    p.add_argument(
        "--measure-threads", type=int, default=measure.threads, metavar="N",
        help="measured selection: onnxruntime intra-op threads, as deployed (default 1)",
    )  # fmt: skip
    p.add_argument(
        "--measure-cache", default=str(DEFAULT_MEASURE_CACHE), metavar="DIR",
        help="measured selection: the local verdict store, read and added to (what was "
        "measured, by region signature and machine class; default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--no-measure-cache",
        action="store_true",
        help="no local verdict store: measure everything (but --verdicts), keep nothing",
    )
    p.add_argument(
        "--verdicts", action="append", default=[], metavar="FILE",
        help="measured selection: also reuse the verdicts in FILE (`autofusion verdicts "
        "export`), read only; repeat for several",
    )  # fmt: skip


def _profile(text: str) -> dict[str, int]:
    """``batch=1,sequence=16`` -> {"batch": 1, "sequence": 16}."""
    profile = {}
    for part in text.split(","):
        name, sep, value = part.partition("=")
        if not sep or not name.strip() or not value.strip().isdigit():
            raise ConfigError(
                f"--shape {text!r}: expected NAME=VALUE pairs, comma-separated",
                hint="for example --shape batch=1,sequence=16 --shape batch=8,sequence=128",
            )
        profile[name.strip()] = int(value)
    return profile


def _names(text: str | None) -> list[str] | None:
    return [n.strip() for n in text.split(",") if n.strip()] if text else None


# CLI option -> the OptimizeConfig field it sets (check options under "check.").
_CONFIG_OPTIONS = {
    "target": "target",
    "patterns": "patterns",
    "exclude": "exclude",
    "no_check": "check.enabled",
    "keep_failed": "keep_failed",
    "strict": "strict",
    "rtol": "check.rtol",
    "atol": "check.atol",
    "samples": "check.samples",
    "seed": "check.seed",
    "shape": "check.profiles",
    "upgrade_opset": "upgrade_opset",
    "progressive": "progressive",
    "precision": "precision",
    "profile": "profile",
    "selection": "selection",
    "target_profile": "target_profile",
    "value_info": "value_info",
    "cost_threshold": "cost_threshold",
    "memory_limit": "memory_limit",
    "measure": "measure",
    "measure_budget": "measure_options.budget_s",
    "measure_threads": "measure_options.threads",
    "measure_cache": "measure_options.cache_dir",
    "verdicts": "measure_options.verdicts_file",
}


def _option_value(args: argparse.Namespace, option: str) -> Any:
    value = getattr(args, option)
    if option in ("patterns", "exclude"):
        return _names(value) if option == "patterns" else _names(value) or []
    if option == "no_check":
        return not value
    if option == "shape":
        return [_profile(text) for text in value]
    if option == "verdicts":  # absolute: the report's config says which files were read
        return [str(Path(v).resolve()) for v in value] or None
    return value


def build_config(args: argparse.Namespace, extra_patterns: list[dict]) -> OptimizeConfig:
    """The strategy file's settings (if any) under every option given on the command
    line, merged as the worker merges a named strategy under a job's options
    (``OptimizeConfig.merged``: excludes add up)."""
    strategy = read_strategy_file(args.strategy) if args.strategy else {}
    given: dict[str, Any] = {"check": {}, "measure_options": {}}
    default_of = getattr(args, "default_of", lambda _option: None)
    for option, field in _CONFIG_OPTIONS.items():
        if args.strategy and getattr(args, option) == default_of(option):
            continue  # not given: the strategy's value (or the config's default) stands
        section, _, name = field.rpartition(".")
        (given[section] if section else given)[name] = _option_value(args, option)
    given["extra_patterns"] = extra_patterns
    try:
        config = OptimizeConfig.merged(strategy, given)
    except ValueError as exc:
        raise ConfigError(f"invalid options: {exc}") from None
    if "cache_dir" in given["measure_options"] and (
        args.no_measure_cache or config.mode != "measured"
    ):  # only a measured run names the folder (it is in the report's config)
        options = config.measure_options.model_copy(update={"cache_dir": None})
        config = config.model_copy(update={"measure_options": options})
    if args.verdicts and config.mode != "measured":
        raise ConfigError(
            "--verdicts is for measured selection",
            hint="add --selection measured (or --measure), or leave --verdicts out",
        )
    return config


def check_verdict_files(paths: list[str]) -> None:
    """Each ``--verdicts`` file read once before the run: one that cannot be read, or
    is not a verdicts file, is a usage error; its invalid verdicts a warning line (the
    run leaves them out)."""
    for path in paths:
        try:
            _, skipped = read_verdicts(path)
        except OSError as exc:
            raise ConfigError(
                f"--verdicts {path}: cannot read it ({exc.strerror or exc})",
                hint="give a verdicts file, as `autofusion verdicts export` writes it",
            ) from None
        except ValueError as exc:
            raise ConfigError(f"--verdicts: {exc}") from None
        if skipped:
            sys.stderr.write(
                f"autofusion: warning: {path}: {len(skipped)} invalid verdict(s) skipped "
                f"(the first: {skipped[0]})\n"
            )


def run(args: argparse.Namespace) -> int:
    extra = []
    for path in args.pattern_file:
        load_pattern_file(path)  # compile once here so errors name the file
        extra += parse_pattern_text(Path(path).read_text(encoding="utf-8"), path)
    config = build_config(args, extra)
    check_verdict_files(args.verdicts)
    feeds = None
    if args.inputs:
        feeds = load_inputs(args.inputs, _graph_only(args.model))
    files = RunFiles(
        report=_path(args.report),
        markdown=_path(args.markdown),
        html=_path(args.html),
        # written only when a step was taken back as a bug: its region, for the bug report
        reproducers=Path(args.output).with_suffix(".reproducers.zip"),
    )
    # --profile, or a strategy file that sets profile: fusion_core.run measures it
    progress = PhaseProgress() if wanted(args.progress, sys.stderr) else None
    with progress or contextlib.nullcontext():
        outcome = run_files(
            args.model, args.output, config, files=files, feeds=feeds, on_phase=progress
        )
    print(format_summary(outcome.report))
    fallback = outcome.result.fallback
    if fallback and not outcome.failed:  # the summary says it too; stderr is what CI shows
        sys.stderr.write(f"autofusion: {fallback_line(fallback)} (--strict fails instead)\n")
    if not outcome.failed:
        return EXIT_OK
    check = outcome.result.check
    kept = f"; the fused model was written anyway to {args.output} (--keep-failed)"
    note = (
        kept
        if outcome.written
        else ("; nothing was written to the output path (--keep-failed writes it)")
    )
    sys.stderr.write(f"autofusion: {describe_failure(check)}{note}\n")
    return EXIT_USAGE if check.failure == ORIGINAL_CANNOT_RUN else EXIT_GATE_FAILED


def _path(value: str | None) -> Path | None:
    return Path(value) if value else None


def _graph_only(path: str) -> onnx.ModelProto:
    """The model's graph, weights left on disk (to describe its inputs)."""
    try:
        return onnx.load(path, load_external_data=False)
    except (OSError, ValueError, DecodeError) as exc:
        raise ModelLoadError(f"cannot read the model {path!r}: {exc}") from None


__all__ = ["add_parser", "run", "PatternError"]
