"""Where a decoder variant's time goes: onnxruntime's profiler, kernel time per op type.

Why: when autofusion's graph is slower than the model builder's (issue 24 asks for within
3 %), the paired ratio says how much, not where. This runs each ``label=path`` variant
(``bench/corpus/bench_llm.py``'s feeds: prefill of ``--prefill`` tokens, decode of one
after ``--past``) with onnxruntime's profiler at ``ORT_ENABLE_ALL`` and 2 threads, all
sessions alive and their runs interleaved, and prints the kernel time per run by op type
(the mean over ``--runs`` runs after one warm-up), side by side, with the MatMuls split by
their output's width (N) so that a merged projection shows apart from the lm head.

    python bench/profile_llm_variants.py original=a.onnx autofusion=b.onnx builder=c.onnx \\
        [--runs 10] [--past 128] [--prefill 128] [--json F]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent / "corpus"))
import bench_llm as timing

from autofusion.fusion_core.profiling import read_trace, session_options


def kernel_label(event: dict) -> str:
    """The op type; a MatMul's (also ORT's FusedMatMul, Gemm) with its output's last dim,
    the projection's width (a prepacked weight's shape is not in the trace)."""
    op = event["args"].get("op_name", "?")
    shapes = event["args"].get("output_type_shape") or []
    if op in ("MatMul", "FusedMatMul", "Gemm") and shapes:
        dims = next(iter(shapes[0].values()), [])
        return f"{op}(N={dims[-1]})" if dims else op
    return op


def by_op_type(events: list[dict], runs: int) -> dict[str, float]:
    """Mean kernel microseconds per run by op type of one trace, its first run dropped."""
    model_runs = [e for e in events if e.get("name") == "model_run"]
    first_end = model_runs[0]["ts"] + model_runs[0]["dur"] if model_runs else 0  # warm-up
    totals: dict[str, float] = defaultdict(float)
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time"):
            continue
        if event["ts"] >= first_end:
            totals[kernel_label(event)] += event["dur"]
    totals["(all kernels)"] = sum(totals.values())
    totals["(model_run)"] = sum(e["dur"] for e in model_runs[1:])
    return {op: us / runs for op, us in totals.items()}


def profile(paths: dict[str, Path], args, phase: str) -> dict[str, dict[str, float]]:
    """Per variant, one phase: every session alive, runs interleaved in a rotating order
    (as ``bench/_interleaved.py``), so that the machine's drift falls on all alike."""
    past, new = (0, args.prefill) if phase == "prefill" else (args.past, 1)
    with tempfile.TemporaryDirectory() as tmp:
        sessions, feeds = {}, {}
        for label, path in paths.items():
            opts = session_options("ORT_ENABLE_ALL", args.threads)
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(tmp) / f"{phase}-{label}")
            sessions[label] = ort.InferenceSession(str(path), opts, ["CPUExecutionProvider"])
            feeds[label] = timing.feeds(sessions[label], past=past, new=new)
        labels = list(paths)
        for i in range(args.runs + 1):
            for label in labels[i % len(labels) :] + labels[: i % len(labels)]:
                sessions[label].run(None, feeds[label])
        return {
            label: by_op_type(read_trace(session.end_profiling()), args.runs)
            for label, session in sessions.items()
        }


def table(results: dict[str, dict[str, dict[str, float]]], phase: str) -> str:
    labels = list(results)
    ops = sorted(
        {op for r in results.values() for op in r[phase]},
        key=lambda op: -max(r[phase].get(op, 0.0) for r in results.values()),
    )
    lines = [f"| {phase}: op type, ms per run | " + " | ".join(labels) + " |"]
    lines.append("|---" * (len(labels) + 1) + "|")
    for op in ops:
        cells = [f"{results[lb][phase].get(op, 0.0) / 1000:.2f}" for lb in labels]
        lines.append(f"| {op} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="+", metavar="LABEL=PATH")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--past", type=int, default=128)
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    paths = {}
    for item in args.variants:
        label, _, path = item.partition("=")
        paths[label] = Path(path)
    phases = {phase: profile(paths, args, phase) for phase in ("decode", "prefill")}
    results = {label: {phase: phases[phase][label] for phase in phases} for label in paths}
    print(table(results, "decode"), "", table(results, "prefill"), sep="\n")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
