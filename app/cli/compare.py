"""``autofusion compare A.onnx B.onnx``: do two models compute the same thing?

Compares every output (the check of ``optimize``: onnxruntime with its optimizations
off, Monte Carlo over seeded inputs or your own), then every intermediate tensor the two
graphs both name, and, when B was fused by autofusion, each fused region against A's
tensors through provenance. Exit code 0 when the outputs match, 1 when they do not,
2 for bad options, 3 for a missing or malformed model.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import onnx
import onnx_ir as ir

from autofusion.app.cli._exit import EXIT_GATE_FAILED, EXIT_OK, EXIT_USAGE
from autofusion.app.cli.optimize import _graph_only, _profile
from autofusion.fusion_core.config import CheckOptions
from autofusion.fusion_core.ir import load_model
from autofusion.fusion_core.validate import (
    ORIGINAL_CANNOT_RUN,
    compare_models,
    compare_regions,
    fused_regions,
    load_inputs,
    random_inputs,
    tensor_diffs,
)

__all__ = ["add_parser", "run"]

_SHOWN = 10  # failing intermediate tensors listed


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser("compare")
    p.add_argument("a", help="the reference model (.onnx)")
    p.add_argument("b", help="the model to compare with it (.onnx), e.g. a fused one")
    p.add_argument("--rtol", type=float, default=CheckOptions().rtol)
    p.add_argument("--atol", type=float, default=CheckOptions().atol)
    p.add_argument("--samples", type=int, default=CheckOptions().samples)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shape", action="append", default=[], metavar="NAME=V[,NAME=V...]")
    p.add_argument("--inputs", help="a .npz file or an ONNX test-data folder")
    p.add_argument("--json", dest="json_path", help="also write the comparison as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    a, b = _proto(args.a), _proto(args.b)
    profiles = [_profile(text) for text in args.shape]
    feeds = load_inputs(args.inputs, _graph_only(args.a)) if args.inputs else None
    check = compare_models(
        a, b, rtol=args.rtol, atol=args.atol, samples=args.samples, seed=args.seed,
        profiles=profiles or None, feeds=feeds,
    )  # fmt: skip
    if check.failure == ORIGINAL_CANNOT_RUN:
        sys.stderr.write(f"autofusion: {check.error}\n")
        return EXIT_USAGE
    if feeds is None:
        dims = check.profiles[0].dims if check.profiles else {}  # sizes the check settled on
        feeds = [random_inputs(a, seed=args.seed + k, dims=dims) for k in range(args.samples)]
    outputs = {o.name for o in a.graph.output}
    shared = sorted(
        ({o for n in a.graph.node for o in n.output} & {o for n in b.graph.node for o in n.output})
        - outputs
        - {""}
    )
    result: dict = {"check": check.to_dict(), "tensors": None, "regions": None}
    lines = [_verdict(check)]
    if shared and check.error is None:
        diffs = tensor_diffs(a, b, shared, feeds, rtol=args.rtol, atol=args.atol)
        order = [o for n in b.graph.node for o in n.output if o in diffs]
        failing = [name for name in order if not diffs[name][2]]
        result["tensors"] = {
            name: {"max_abs_diff": _finite(d[0]), "max_rel_diff": _finite(d[1]), "passed": d[2]}
            for name, d in diffs.items()
        }
        lines.append(f"intermediate tensors named in both: {len(shared)}, {len(failing)} differ")
        lines += [f"  {name}: max abs diff {diffs[name][0]:.3g}" for name in failing[:_SHOWN]]
    if fused_regions(b):
        regions = compare_regions(a, b, feeds, rtol=args.rtol, atol=args.atol)
        result["regions"] = regions.to_dict()
        drift = regions.first_drift
        culprit = drift and f"{drift.pattern} (replaced {', '.join(drift.replaced_nodes[:5])})"
        lines.append(
            f"fused regions: {len(regions.regions)}, first that drifts: "
            + (culprit if drift else "none")
        )
    print("\n".join(lines))
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return EXIT_OK if check.passed else EXIT_GATE_FAILED


def _proto(path: str) -> onnx.ModelProto:
    """Loaded safely (external data checked), weights in, as onnxruntime takes it."""
    model = load_model(path)
    ir.external_data.load_to_model(model)
    return ir.to_proto(model)


def _verdict(check) -> str:
    if check.error:
        return f"outputs: could not compare: {check.error}"
    state = "match" if check.passed else "DIFFER"
    worst = ", ".join(f"{o.name} {o.max_abs_diff:.3g}" for o in check.outputs)
    return f"outputs {state} (max abs diff per output: {worst})"


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no infinity
