"""``autofusion profile``: measure a model (or an original against its fused model) in
onnxruntime, locally, and print where the time goes.

Exit codes: 0 measured, 2 usage or option error, 3 a model is missing, malformed or
unsafe (the same codes as ``optimize``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from autofusion.app.cli._exit import EXIT_BAD_INPUT, EXIT_OK, EXIT_USAGE
from autofusion.fusion_core.errors import ConfigError, FusionError, ModelLoadError, UnsafeModelError
from autofusion.fusion_core.profiling import ProfileOptions, profile_models

__all__ = ["add_parser", "format_profile", "run"]

TOP_OP_TYPES = 8


def add_parser(commands: argparse._SubParsersAction) -> None:
    defaults = ProfileOptions()
    p = commands.add_parser("profile")
    p.add_argument("model", help="the (original) .onnx file (external data next to it)")
    p.add_argument("--fused", help="a fused .onnx file to compare against MODEL")
    p.add_argument("--threads", type=int, default=defaults.threads, help="intra-op threads")
    p.add_argument("--warmup", type=int, default=defaults.warmup, help="untimed runs first")
    p.add_argument("--iters", type=int, default=defaults.iters, help="timed runs per session")
    p.add_argument("--node-runs", type=int, default=defaults.node_runs, help="traced runs")
    p.add_argument(
        "--dims",
        nargs="+",
        action="extend",
        default=[],
        metavar="NAME=VALUE",
        help="values of symbolic input dimensions (others are 1)",
    )
    p.add_argument("--seed", type=int, default=defaults.seed, help="seed of the random inputs")
    p.add_argument(
        "--providers",
        default=",".join(defaults.providers),
        help="onnxruntime execution providers, comma-separated, in order of preference",
    )
    p.add_argument("--json", dest="json_path", help="also write the profile as JSON here")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        options = ProfileOptions(
            threads=args.threads,
            warmup=args.warmup,
            iters=args.iters,
            node_runs=args.node_runs,
            providers=tuple(p.strip() for p in args.providers.split(",") if p.strip()),
            seed=args.seed,
            dims=_dims(args.dims),
        )
        report = profile_models(args.model, args.fused, options=options).to_dict()
    except (ModelLoadError, UnsafeModelError) as exc:
        return _fail(exc, EXIT_BAD_INPUT)
    except FusionError as exc:
        return _fail(exc, EXIT_USAGE)
    if args.json_path:
        path = Path(args.json_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report, indent=2, allow_nan=False) + "\n", encoding="utf-8")
    print(format_profile(report, model=args.model, fused=args.fused))
    return EXIT_OK


def _dims(items: list[str]) -> dict[str, int]:
    dims = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value.strip().lstrip("-").isdigit() or int(value) < 1:
            raise ConfigError(f"--dims {item!r} is not NAME=VALUE with a positive whole VALUE")
        dims[name.strip()] = int(value)
    return dims


def _fail(exc: FusionError, code: int) -> int:
    sys.stderr.write(f"autofusion: error: {exc}\n")
    return code


def format_profile(report: dict[str, Any], *, model: str, fused: str | None = None) -> str:
    """The readable summary of a profile's JSON data."""
    opts = report["options"]
    lines = [
        f"autofusion profile: {model}" + (f" vs {fused}" if fused else ""),
        f"  {opts['threads']} thread(s), {opts['warmup']} warm-up, {opts['iters']} timed "
        f"runs per session, {', '.join(opts['providers'])}",
    ]
    lines += _latency(report["latency"])
    for label in ("original", "fused"):
        if report["nodes"][label] is not None:
            lines += _op_types(label, report["nodes"][label])
    lines += _patterns(report["patterns"])
    return "\n".join(lines)


def _latency(comparisons: list[dict[str, Any]]) -> list[str]:
    lines = [f"latency (ms)     {'median':>10} {'p90':>10} {'min':>10} {'create':>10}"]
    for comparison in comparisons:
        lines.append(comparison["level"])
        for s in comparison["sessions"]:
            lines.append(
                f"  {s['label']:<14} {s['median_ms']:>10.3f} {s['p90_ms']:>10.3f} "
                f"{s['min_ms']:>10.3f} {s['create_ms']:>10.1f}"
            )
        if comparison["ratio"] is not None:
            lines.append(
                f"  median ratio fused/original {comparison['ratio']:.3f} (below 1: faster)"
            )
    return lines


def _op_types(label: str, nodes: dict[str, Any]) -> list[str]:
    runs = max(nodes["runs"], 1)
    lines = [f"top op types, {label} ({nodes['level']}, us per run, {nodes['runs']} traced runs)"]
    for op in nodes["op_types"][:TOP_OP_TYPES]:
        lines.append(
            f"  {op['op_type']:<24} {op['total_us'] / runs:>10.1f}  {op['nodes']:>4} node(s)"
        )
    if nodes["traced_run_us"] is not None:
        traced = nodes["traced_run_us"]
        lines.append(f"  traced run {traced:.1f} us (profiler overhead included)")
    peak = nodes["memory"]["allocator_peak_bytes"]
    if peak is not None:
        lines.append(f"  allocator peak {peak / 1024:.1f} KiB")
    return lines


def _patterns(patterns: list[dict[str, Any]]) -> list[str]:
    if not patterns:
        return []
    lines = [
        f"fused regions (us per run)  {'regions':>7} {'before':>10} {'after':>10} {'ratio':>7}"
    ]
    for p in patterns:
        ratio = f"{p['ratio']:.2f}" if p["ratio"] is not None else "-"
        lines.append(
            f"  {p['pattern']:<25} {p['regions']:>7} {p['before_us']:>10.1f} "
            f"{p['after_us']:>10.1f} {ratio:>7}"
        )
    return lines
