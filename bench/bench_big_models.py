"""Memory and time of ``autofusion optimize`` on big synthetic decoders (issue 29).

For each size (GiB of weights, ``bench/_big_models.py`` builds the decoder with its
external data, cached in ``--cache``) and each mode (``check``: the defaults;
``no-check``: ``--no-check``; ``profile``: the defaults and ``--profile``;
``no-check-profile``: both; each with ``-one-file``: the same decoder saved as one file,
its weights inside, so the fused model is one file too), runs the
CLI in a child process, target onnxruntime, and reads:

* the child's peak resident memory (``os.wait4``'s ``ru_maxrss``: what ``/usr/bin/time
  -v`` calls the maximum resident set size) and its multiple of the model's bytes on
  disk (model file and external data);
* from its report.json: the time per phase (``timings_s``), the peak at the end of each
  phase (``optimize_memory.by_phase``), the prediction (``fusion_core.predict_memory``),
  the nodes before and after, and the check's verdict and max abs diff.

``--weights fp16|int4`` (``--block-size``) builds the decoder with those weights, the size
in GiB as stored; ``--preset 7b`` runs Llama-2-7B / Mistral-7B's shape instead of sizes.
``--latency N`` then times the prefill (128 tokens) and a one-token step of the original
against the fused model, N interleaved rounds, in a child of its own
(``bench/big_latency.py``: the synthetic decoder has no KV cache).

Prints one JSON line per run, then Markdown tables (docs/benchmarks.md, sections 27-28)::

    python bench/bench_big_models.py --sizes 0.25 0.5 1.0 [--modes check no-check]
    python bench/bench_big_models.py --sizes 0.25 --modes profile
    python bench/bench_big_models.py --sizes 0.25 0.5 1.0 --modes check-one-file
    python bench/bench_big_models.py --sizes 3 --weights fp16 --modes check --latency 3
    python bench/bench_big_models.py --preset 7b --weights int4 --block-size 128 --modes check

Mind the machine: with the check on, a run peaks at several times the model's size.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import onnx
from _big_models import MODEL_FILE, PRESETS, make_decoder, shape_for_size
from _big_weights import FP32, KINDS, Weights

GIB = 1 << 30
MODES = {
    "check": [],
    "no-check": ["--no-check"],
    "profile": ["--profile"],
    "no-check-profile": ["--no-check", "--profile"],
}
ONE_FILE = "-one-file"  # the mode on the decoder saved as one file, weights inside
# `autofusion`, as installed: its entry point in this interpreter
CLI = [sys.executable, "-c", "import sys; from autofusion.app.cli import main; sys.exit(main())"]


def model_for(
    size_gb: float | str, cache: Path, *, one_file: bool = False, weights: Weights = FP32
) -> tuple[Path, dict]:
    """The decoder of ``size_gb`` GiB (or the preset of that name), built once in ``cache``."""
    typed = "" if weights == FP32 else f"_{weights.kind}"
    typed += f"_b{weights.block_size}_a{weights.accuracy_level}" if weights.kind == "int4" else ""
    label = f"{size_gb}" if isinstance(size_gb, str) else f"{size_gb:g}gib"
    folder = cache / f"decoder_{label}{typed}{'_one_file' if one_file else ''}"
    info_file = folder / "info.json"
    if info_file.is_file() and (folder / MODEL_FILE).is_file():
        return folder / MODEL_FILE, json.loads(info_file.read_text())
    start = time.perf_counter()
    if one_file:  # the decoder with external data, its weights read in and saved inside
        source, info = model_for(size_gb, cache, weights=weights)
        folder.mkdir(parents=True, exist_ok=True)
        onnx.save_model(onnx.load(source), folder / MODEL_FILE)
        info = {**info, "path": str(folder / MODEL_FILE), "data_bytes": 0}
        info["model_bytes"] = (folder / MODEL_FILE).stat().st_size
    else:
        shape = PRESETS[size_gb] if isinstance(size_gb, str) else None
        shape = shape or shape_for_size(size_gb * GIB, weights=weights)
        info = make_decoder(folder, shape, weights=weights)
    info["build_s"] = round(time.perf_counter() - start, 2)
    info_file.write_text(json.dumps(info))
    return folder / MODEL_FILE, info


def run_cli(model: Path, mode: str, out: Path) -> dict:
    """One ``autofusion optimize`` in a child; its peak RSS, wall time and report.

    The peak is wait4's ``ru_maxrss``, as ``/usr/bin/time -v`` reports it; Linux starts it
    at the forking parent's resident size, this bench's own process (a few hundred MB
    with onnx and numpy loaded), so on the smallest models it reads high. The report's
    ``optimize_memory.peak_rss_bytes`` (VmHWM, reset by exec) is the child's alone."""
    report = out / "report.json"
    flags = MODES[mode.removesuffix(ONE_FILE)]
    command = [*CLI, "optimize", str(model), "-o", str(out / "fused.onnx"),
               "--target", "onnxruntime", "--report", str(report), *flags]  # fmt: skip
    start = time.perf_counter()
    with open(out / "log.txt", "wb") as log:
        child = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    wall = time.perf_counter() - start
    data = json.loads(report.read_text()) if report.is_file() else {}
    return {"exit": child.returncode, "wall_s": round(wall, 1),
            "peak_rss_bytes": usage.ru_maxrss * 1024, "report": data}  # fmt: skip


def latency(model: Path, fused: Path, iters: int) -> dict:
    """bench/big_latency.py in a child: prefill and one-token step, original vs fused."""
    script = Path(__file__).resolve().parent / "big_latency.py"
    command = [sys.executable, str(script), str(model), str(fused), "--iters", str(iters)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1:]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(size_gb: float | str, info: dict, mode: str, ran: dict) -> dict:
    report = ran["report"]
    own = report.get("optimize_memory") or {}
    check = report.get("check") or {}
    model_bytes = info["model_bytes"]
    phases = own.get("by_phase") or {}
    return {
        "size_gib": size_gb,
        "weights": (info.get("weights") or {}).get("kind", "fp32"),
        "mode": mode,
        "model_bytes": model_bytes,
        "layers": info["shape"]["layers"],
        "hidden": info["shape"]["hidden"],
        "exit": ran["exit"],
        "wall_s": ran["wall_s"],
        "peak_rss_bytes": ran["peak_rss_bytes"],
        "ratio": round(ran["peak_rss_bytes"] / model_bytes, 2),
        "predicted_peak_bytes": own.get("predicted_peak_bytes"),
        "timings_s": report.get("timings_s"),
        "by_phase": {k: v.get("peak_rss_bytes") for k, v in phases.items()},
        "resident_by_phase": {k: v.get("rss_bytes") for k, v in phases.items()},
        "nodes": [report.get("nodes", {}).get("before"), report.get("nodes", {}).get("after")],
        "fusions": sum((report.get("fusions") or {}).values()),
        "check": None if not check else (check.get("passed"), check.get("max_abs_diff")),
        # the dims the check ran (validate/_dims.py sizes dynamic ones small) and samples
        "check_dims": [(pr.get("dims"), pr.get("samples")) for pr in check.get("profiles", [])],
        "fusions_by_pattern": report.get("fusions"),
        # the fused model's weights in a data file beside it (bytes), or 0: one file
        "fused_data_bytes": (report.get("size") or {}).get("after_external_data_bytes"),
    }


def _gib(value: int | None) -> str:
    return "—" if value is None else f"{value / GIB:.2f}"


def tables(rows: list[dict]) -> str:
    lines = [
        "| model (GiB) | layers | mode | wall s | peak RSS GiB | x model | predicted GiB "
        "| nodes | check | fused |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        check = "off" if r["check"] is None else f"{'passed' if r['check'][0] else 'FAILED'} "
        check += "" if r["check"] is None else f"{r['check'][1]:.1e}"
        lines.append(
            f"| {_gib(r['model_bytes'])} | {r['layers']} | {r['mode']} | {r['wall_s']} "
            f"| {_gib(r['peak_rss_bytes'])} | {r['ratio']} | {_gib(r['predicted_peak_bytes'])} "
            f"| {r['nodes'][0]} -> {r['nodes'][1]} | {check} "
            f"| {'with data' if r.get('fused_data_bytes') else 'one file'} |"
        )
    lines += ["", "| model (GiB) | mode | seconds by phase | peak GiB at the end of each phase |",
              "|---|---|---|---|"]  # fmt: skip
    for r in rows:
        times = ", ".join(f"{k} {v:.1f}" for k, v in (r["timings_s"] or {}).items())
        peaks = ", ".join(f"{k} {_gib(v)}" for k, v in r["by_phase"].items())
        lines.append(f"| {_gib(r['model_bytes'])} | {r['mode']} | {times} | {peaks} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.25, 0.5, 1.0])
    modes = [*MODES, *(m + ONE_FILE for m in MODES)]
    parser.add_argument("--modes", nargs="+", choices=modes, default=["check", "no-check"])
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "af-big")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--weights", choices=KINDS, default="fp32")
    parser.add_argument("--block-size", type=int, default=32, help="int4's block")
    parser.add_argument("--accuracy-level", type=int, default=4, help="int4's (builder: 4)")
    parser.add_argument("--preset", choices=sorted(PRESETS), help="this shape, not --sizes")
    parser.add_argument("--latency", type=int, default=0, help="rounds of timing (0: none)")
    args = parser.parse_args(argv)
    weights = Weights(args.weights, args.block_size, args.accuracy_level)
    rows = []
    for size in [args.preset] if args.preset else args.sizes:
        for mode in args.modes:
            one_file = mode.endswith(ONE_FILE)
            model, info = model_for(size, args.cache, one_file=one_file, weights=weights)
            with tempfile.TemporaryDirectory(prefix="af-big-out-", dir=args.cache) as out:
                ran = run_cli(model, mode, Path(out))
                rows.append(row(size, info, mode, ran))
                if args.latency and ran["exit"] == 0:
                    rows[-1]["latency"] = latency(model, Path(out) / "fused.onnx", args.latency)
            print(json.dumps(rows[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    print(tables(rows))


if __name__ == "__main__":
    main()
