"""What the per-step checks of issue 25 cost: ``optimize`` with and without them.

Every rewrite, canonical rule and pre-pass is checked after it runs (op and attributes
against the opset's schema, node-level type inference, no cycle:
``fusion_core/pipeline/transaction.py``). This times ``optimize`` (check off, so only the
fusion pipeline is timed) on corpus models with those checks as shipped and with them
replaced by no-ops, interleaved in one process, and prints the median of each and the
median of the paired ratios (on / off) with its 10th-90th percentile.

    .venv/bin/python bench/bench_transactions.py --rounds 7 MODEL_NAME ...
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from autofusion.fusion_core import OptimizeConfig, optimize
from autofusion.fusion_core.pipeline import rounds, transaction

CACHE = Path.home() / ".cache" / "autofusion-corpus" / "models"
DEFAULT = [
    "llm_llama_optimum_kv",
    "llm_qwen3_moe_torchscript",
    "deberta_v2_eager_torchscript",
    "ppocr_det_v4",
    "ppocr_rec_v4",
]


class _Checks:
    """Switches the per-step checks off and on again (the shipped functions back)."""

    def __init__(self) -> None:
        self.problems = rounds.step_problems
        self.changed = transaction.StepGuard.changed

    def set(self, on: bool) -> None:
        rounds.step_problems = self.problems if on else (lambda *args: None)
        transaction.StepGuard.changed = self.changed if on else (lambda self, name: None)


def _time(path: Path, config: OptimizeConfig) -> float:
    start = time.perf_counter()
    optimize(path, config)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", default=DEFAULT)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--target", default="onnxruntime")
    args = parser.parse_args(argv)
    config = OptimizeConfig(target=args.target, check={"enabled": False})
    checks = _Checks()
    print("| model | fusions | checks on, median s | off, median s | on / off [p10-p90] |")
    print("|---|---|---|---|---|")
    for name in args.models:
        path = CACHE / name / "model.onnx"
        result = optimize(path, config)  # warm: imports, caches
        on, off, ratios = [], [], []
        for k in range(args.rounds):
            pair = {}
            for state in (k % 2 == 0, k % 2 == 1):  # alternate which goes first
                checks.set(state)
                pair[state] = _time(path, config)
            checks.set(True)
            on.append(pair[True])
            off.append(pair[False])
            ratios.append(pair[True] / pair[False])
        deciles = statistics.quantiles(ratios, n=10) if len(ratios) > 1 else ratios * 9
        print(
            f"| {name} | {len(result.applied)} | {statistics.median(on):.3f} | "
            f"{statistics.median(off):.3f} | {statistics.median(ratios):.3f} "
            f"[{deciles[0]:.3f}-{deciles[-1]:.3f}] |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
