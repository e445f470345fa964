"""Time ``optimize`` on the full-size ResNet-50 (224x224, 1000 classes, BN kept).

Both torch exporters (TorchScript and dynamo), both targets; each combination
runs ``--repeat`` times (after ``--warmup`` untimed runs) and the table gives
the median seconds of every phase ``Result.timings`` reports (load,
prepasses, match, rewrite, cleanup, check), their sum, the median wall time
of the whole ``optimize`` call, and the fusion counts.

The models come from ``bench/make_resnet_models.py`` (needs the ``torch``
extra). They are generated into ``--models DIR`` when that folder does not
hold them yet, or into a temporary folder that is deleted afterwards.

    python bench/bench_optimize_resnet50.py [--models DIR] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from autofusion.fusion_core import OptimizeConfig, Result, optimize

EXPORTERS = ("torchscript", "dynamo")
TARGETS = ("generic", "onnxruntime")
PHASES = ("load", "prepasses", "match", "rewrite", "cleanup", "check")


def model_path(folder: Path, exporter: str) -> Path:
    return folder / f"resnet50_{exporter}.onnx"


def ensure_models(folder: Path) -> None:
    """Generate the full-size models into ``folder`` unless both are there."""
    if all(model_path(folder, e).is_file() for e in EXPORTERS):
        return
    # Imported here: it needs torch, which a run on existing models does not.
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import make_resnet_models

    make_resnet_models.generate(folder, "resnet50", width=1.0, size=224, num_classes=1000)


@contextmanager
def models_folder(given: Path | None) -> Iterator[Path]:
    if given is not None:
        given.mkdir(parents=True, exist_ok=True)
        ensure_models(given)
        yield given
        return
    with tempfile.TemporaryDirectory(prefix="resnet50-") as tmp:
        ensure_models(Path(tmp))
        yield Path(tmp)


def time_runs(path: Path, target: str, repeat: int, warmup: int) -> dict:
    """Median phase timings and wall time over ``repeat`` runs of ``optimize(path)``."""
    config = OptimizeConfig(target=target)
    runs: list[tuple[float, Result]] = []
    for i in range(warmup + repeat):
        gc.collect()
        start = time.perf_counter()
        result = optimize(path, config)
        wall = time.perf_counter() - start
        if i >= warmup:
            runs.append((wall, result))
    last = runs[-1][1]
    assert last.check is not None
    return {
        "phases": {p: statistics.median(r.timings.get(p, 0.0) for _, r in runs) for p in PHASES},
        "sum": statistics.median(sum(r.timings.values()) for _, r in runs),
        "wall": statistics.median(w for w, _ in runs),
        "counts": last.counts,
        "check": last.check.passed,
        "max_abs_diff": last.check.max_abs_diff,
        "rounds": last.rounds,
    }


def table(rows: list[tuple[str, str, dict]]) -> str:
    head = " | ".join(PHASES)
    lines = [
        f"| exporter | target | {head} | sum of phases | wall | rounds "
        "| verdict (max abs diff) | fusions |",
        "| --- | --- |" + " ---: |" * (len(PHASES) + 3) + " --- | --- |",
    ]
    for exporter, target, r in rows:
        cells = " | ".join(f"{r['phases'][p]:.3f}" for p in PHASES)
        counts = ", ".join(f"{k} {v}" for k, v in sorted(r["counts"].items()))
        check = f"{'pass' if r['check'] else 'FAIL'} ({r['max_abs_diff']:.1e})"
        lines.append(
            f"| {exporter} | {target} | {cells} | {r['sum']:.3f} | {r['wall']:.3f} "
            f"| {r['rounds']} | {check} | {counts} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, help="folder of (or for) the two models")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs per case (median)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs per case first")
    args = parser.parse_args(argv)

    rows = []
    with models_folder(args.models) as folder:
        for exporter in EXPORTERS:
            for target in TARGETS:
                r = time_runs(model_path(folder, exporter), target, args.repeat, args.warmup)
                rows.append((exporter, target, r))
    print(
        f"optimize() on full-size ResNet-50: median seconds over {args.repeat} runs "
        f"({args.warmup} warm-up), check enabled (2 samples)\n"
    )
    print(table(rows))


if __name__ == "__main__":
    main()
