"""What one pattern with optional groups costs the matcher against the per-spelling
patterns it replaced.

Times ``Matcher(specs).find(graph)`` on corpus models (after the canonical form, as
``optimize`` matches) with this release's built-ins and with the built-ins of another
revision (``--before REV``: its pattern YAML read from git), interleaved, and prints the
median of each with the spread and their ratio per model.

    python bench/bench_match_variants.py --before 07d0e94 [--repeat 15] MODEL...

MODEL is a corpus model name (``~/.cache/autofusion-corpus/models/<name>/model.onnx``)
or a path.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

import onnx_ir as ir
import yaml

from autofusion.fusion_core.canonical import canonical_form
from autofusion.fusion_core.catalog import builtin_pattern_data
from autofusion.fusion_core.patterns import Matcher, PatternSpec

ROOT = Path(__file__).resolve().parents[1]
BUILTIN = "fusion_core/patterns/builtin"
MODELS = Path.home() / ".cache" / "autofusion-corpus" / "models"


def specs_at(revision: str) -> list[PatternSpec]:
    """The built-in pattern specs of ``revision`` (read from git, not imported)."""
    listing = subprocess.run(
        ["git", "ls-tree", "--name-only", f"{revision}:{BUILTIN}"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    specs = []
    for name in listing:
        text = subprocess.run(
            ["git", "show", f"{revision}:{BUILTIN}/{name}"],
            cwd=ROOT, check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        doc = yaml.safe_load(text) or {}
        for raw in doc.get("patterns", [doc]) if "nodes" not in doc else [doc]:
            specs.append(PatternSpec.model_validate(raw))
    return specs


def graph_of(model: str) -> ir.Graph:
    path = Path(model) if Path(model).exists() else MODELS / model / "model.onnx"
    loaded = ir.load(str(path))
    names = iter(range(10**9))
    canonical_form(loaded.graph, lambda hint: f"{hint}_bench_{next(names)}")
    return loaded.graph


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="git revision to compare with")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("models", nargs="+")
    args = parser.parse_args()
    now = [PatternSpec.model_validate(raw) for raw in builtin_pattern_data()]
    before = specs_at(args.before)
    print(f"built-ins: {len(before)} at {args.before}, {len(now)} now\n")
    print("| model | nodes | before (ms) | now (ms) | now / before |")
    print("| --- | --- | --- | --- | --- |")
    for model in args.models:
        graph = graph_of(model)
        times: dict[str, list[float]] = {"before": [], "now": []}
        counts = {}
        for _ in range(args.repeat):  # interleaved
            for label, specs in (("before", before), ("now", now)):
                start = time.perf_counter()
                found = Matcher(specs).find(graph)
                times[label].append((time.perf_counter() - start) * 1e3)
                counts[label] = len(found.candidates)
        b, n = (statistics.median(times[k]) for k in ("before", "now"))
        spread = {k: (min(v), max(v)) for k, v in times.items()}
        print(
            f"| {model} | {sum(1 for _ in graph)} | {b:.1f} [{spread['before'][0]:.1f}-"
            f"{spread['before'][1]:.1f}] | {n:.1f} [{spread['now'][0]:.1f}-"
            f"{spread['now'][1]:.1f}] | {n / b:.2f} |"
        )


if __name__ == "__main__":
    main()
