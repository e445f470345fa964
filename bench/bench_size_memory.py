"""Model size on disk and peak memory, original against fused, with the default preset
on both targets (issue 14: "measure what is true" of the seeds' -18% package size and
-32% peak memory).

For each model and target: ``optimize`` with ``OptimizeConfig(target=...)`` (the check
on, as by default), the fused model saved, then

* size: ``fusion_core.profiling.footprint.model_size`` of both (file plus external data);
* peak memory: ``fusion_core.profiling.footprint.measure_memory`` (each model in a fresh process:
  VmHWM over one ORT_ENABLE_ALL session and 3 runs, less the process before the
  session), ``--repeat`` times, the median;
* onnxruntime's allocator peak from one traced run (``fusion_core.profiling.profile_nodes``,
  ORT_DISABLE_ALL), as the report's ``allocator_peak_*``.

Inputs: the corpus's ``<name>.inputs.npz`` beside a model when there is one, else the
inputs the check generated first (its dims). Prints JSON lines, then a Markdown table::

    python bench/bench_size_memory.py                 # tests/data picks + the bench corpus
    python bench/bench_size_memory.py MODEL.onnx ...  # these models
    python bench/bench_size_memory.py --mmap-threshold 131072 --json rows.json

glibc's dynamic mmap threshold makes a large model's session peak swing between two
values from run to run (vit_base: 383 or 578 MiB); ``--mmap-threshold`` fixes it in the
measuring processes, so that original and fused compare on the same allocator policy.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from autofusion.fusion_core import OptimizeConfig, optimize, save_model
from autofusion.fusion_core.profiling import ProfileOptions, profile_nodes
from autofusion.fusion_core.profiling.footprint import measure_memory, model_size

REPO = Path(__file__).resolve().parents[1]
TEST_MODELS = [
    REPO / "tests/data/resnet/resnet50_w8_torchscript.onnx",
    REPO / "tests/data/resnet/resnet50_w8_dynamo.onnx",
    REPO / "tests/data/transformers/bert_eager_torchscript.onnx",
    REPO / "tests/data/transformers/gpt2_eager_dynamo.onnx",
    REPO / "tests/data/transformers/vit_sdpa_torchscript.onnx",
]
CORPUS = Path.home() / ".cache" / "autofusion-bench" / "corpus"
TARGETS = ("generic", "onnxruntime")


def default_models() -> list[Path]:
    corpus = sorted(CORPUS.glob("*.onnx")) if CORPUS.is_dir() else []
    return TEST_MODELS + corpus


def feeds_for(path: Path) -> dict[str, np.ndarray] | None:
    npz = path.with_name(path.stem + ".inputs.npz")
    if not npz.is_file():
        return None
    with np.load(npz, allow_pickle=False) as data:
        return {name: data[name] for name in data.files}


def measure(path: Path, target: str, repeat: int, scratch: Path) -> dict:
    feeds = feeds_for(path)
    config = OptimizeConfig(target=target)
    result = optimize(path, config, feeds=[feeds] if feeds is not None else None)
    fused = scratch / f"{path.stem}.{target}.onnx"
    save_model(result.model, fused)
    check = result.check
    dims = check.profiles[0].dims if check and check.profiles else {}
    runs = [measure_memory(path, fused, feeds=feeds, dims=dims) for _ in range(repeat)]
    errors = [m.error for r in runs for m in (r.original, r.fused) if m.error]
    if errors:
        raise RuntimeError(errors[0])
    options = ProfileOptions(warmup=1, node_runs=1, dims=dims)
    allocator = {}
    for label, model in (("original", path), ("fused", fused)):
        nodes = profile_nodes(model, feeds or _check_feeds(model, dims), options=options)
        allocator[label] = nodes.memory.allocator_peak_bytes
    before, after = model_size(path), model_size(fused)
    return {
        "model": path.stem,
        "target": target,
        "fusions": sum(result.counts.values()),
        "check_passed": bool(check.passed) if check else None,
        "size_before": before.total_bytes,
        "size_after": after.total_bytes,
        "peak_before": statistics.median(r.original.peak_bytes for r in runs),
        "peak_after": statistics.median(r.fused.peak_bytes for r in runs),
        "peak_before_range": _range(r.original.peak_bytes for r in runs),
        "peak_after_range": _range(r.fused.peak_bytes for r in runs),
        "resident_before": statistics.median(r.original.resident_bytes for r in runs),
        "resident_after": statistics.median(r.fused.resident_bytes for r in runs),
        "allocator_before": allocator["original"],
        "allocator_after": allocator["fused"],
        "repeat": repeat,
    }


def _check_feeds(model: Path, dims: dict[str, int]) -> dict[str, np.ndarray]:
    import onnx

    from autofusion.fusion_core.validate import random_inputs

    return random_inputs(onnx.load(model, load_external_data=False), seed=0, dims=dims)


def _range(values) -> list[int]:
    values = list(values)
    return [min(values), max(values)]


def bytes_text(value: float) -> str:
    """MiB with two decimals (KiB below 1 MiB), one unit per column to compare."""
    return f"{value / 2**20:.2f} MiB" if value >= 2**20 else f"{value / 1024:.1f} KiB"


def _peak(row: dict, side: str) -> str:
    """The median, and the range when the runs differ by 1 MiB or more."""
    low, high = row[f"peak_{side}_range"]
    shown = f"{row[f'peak_{side}'] / 2**20:.0f}"
    return shown + (f" [{low / 2**20:.0f}-{high / 2**20:.0f}]" if high - low >= 2**20 else "")


def _change(before: float | None, after: float | None) -> str:
    return f"{(after - before) / before:+.1%}" if before and after is not None else "n/a"


def table(rows: list[dict]) -> str:
    lines = [
        "| model | target | fusions | size before | after | change | peak memory before, MiB "
        "| after, MiB | change | allocator peak before | after | change |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        peaks = (r["allocator_before"], r["allocator_after"])
        alloc = [bytes_text(v) if v else "n/a" for v in peaks]
        lines.append(
            f"| {r['model']} | {r['target']} | {r['fusions']} | {bytes_text(r['size_before'])} "
            f"| {bytes_text(r['size_after'])} | {_change(r['size_before'], r['size_after'])} "
            f"| {_peak(r, 'before')} | {_peak(r, 'after')} "
            f"| {_change(r['peak_before'], r['peak_after'])} | {alloc[0]} | {alloc[1]} "
            f"| {_change(r['allocator_before'], r['allocator_after'])} |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", type=Path)
    parser.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    parser.add_argument("--repeat", type=int, default=3, help="memory measurements per model")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--table", type=Path, help="only print the table of a --json file")
    parser.add_argument(
        "--mmap-threshold",
        type=int,
        metavar="BYTES",
        help="set glibc's MALLOC_MMAP_THRESHOLD_ in the measuring processes: a fixed "
        "threshold (131072) takes out the run-to-run swings of its dynamic one",
    )
    args = parser.parse_args()
    if args.table:
        print(table(json.loads(args.table.read_text(encoding="utf-8"))))
        return 0
    if args.mmap_threshold:
        # Read by glibc when a process starts: the measuring children inherit it.
        os.environ["MALLOC_MMAP_THRESHOLD_"] = str(args.mmap_threshold)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-size-memory-") as scratch:
        for path in args.models or default_models():
            for target in args.targets:
                try:
                    row = measure(path, target, args.repeat, Path(scratch))
                except Exception as exc:  # one model's failure is a line, not the end
                    print(f"{path.stem} {target}: {type(exc).__name__}: {exc}", file=sys.stderr)
                    continue
                row["mmap_threshold"] = args.mmap_threshold
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    print()
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
