"""autofusion against the ONNX optimizers people use today, on the corpus of real networks.

For every corpus model (``bench/make_corpus.py``; exported on first use) and every tool
(``bench/_tools.py``: onnxruntime's offline optimizer at ORT_ENABLE_EXTENDED and
ORT_ENABLE_ALL, onnxruntime.transformers.optimizer, onnxscript's optimizer, rewriter and
ort_fusions, onnxoptimizer, onnxslim, and autofusion for both targets with the default,
vision and nlp strategy presets):

1. optimize time: the tool goes from the exported file to an optimized file on disk
   (load, optimize, save), in a fresh process per tool (imports before the clock),
   ``--tool-warmup`` untimed runs then ``--repeat`` timed runs, median;
2. the optimized graph: node count, fused ops (op types, with domain, that the original
   does not have) and their counts;
3. numerical difference: max abs diff of every output against the original, both run
   in onnxruntime at ORT_DISABLE_ALL on the model's saved seeded inputs;
4. latency at ORT_DISABLE_ALL and ORT_ENABLE_ALL: at each level one session per variant
   (the original and every tool's output; ``--threads`` intra-op threads, one inter-op
   thread, thread spinning off; creation time recorded), ``--warmup`` then ``--iters``
   runs, interleaved: each iteration runs every session once and the session that goes
   first rotates. Per variant: median, p90, the ratio of its median to the original's,
   and the median of the paired ratios (its run / the original's run in the same
   iteration); below 1 is faster.

A tool that fails, or whose output onnxruntime cannot load or run, is recorded with a
short error; the benchmark goes on. Writes everything to ``--json``, prints Markdown
tables and, with ``--charts DIR``, saves PNG charts there.

    python bench/bench_tools.py [--corpus DIR] [--models ...] [--tools ...]
        [--iters 30] [--warmup 5] [--repeat 3] [--threads 2]
        [--json results.json] [--charts DIR]
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
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _tools
import _tools_report

logger = logging.getLogger("bench_tools")

LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL")
DEFAULT_CORPUS = Path.home() / ".cache" / "autofusion-bench" / "corpus"
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


def session(path: Path, level: str, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    # idle sessions' spinning pool threads would steal the CPUs of the one being timed
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    so.add_session_config_entry("session.inter_op.allow_spinning", "0")
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def feeds_for(sess: ort.InferenceSession, feeds: dict) -> dict:
    return {i.name: feeds[i.name] for i in sess.get_inputs()}


def short(err: Exception) -> str:
    first = (str(err).strip().splitlines() or [""])[0]
    return f"{type(err).__name__}: {first[:300]}"


def run_tool(tool: str, src: Path, dst: Path, entry: dict, args: argparse.Namespace) -> dict:
    """One tool, ``args.repeat`` times, in a fresh process (see _tools.worker)."""
    with tempfile.TemporaryDirectory(prefix="bench-tool-") as tmp:
        entry_json, out_json = Path(tmp) / "entry.json", Path(tmp) / "out.json"
        entry_json.write_text(json.dumps(entry))
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
            record["paired_ratio"] = statistics.median(
                t / b for t, b in zip(times, base, strict=True)
            )
    return out


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
        for level in LEVELS:
            progress(f"  latency at {level} ({len(paths)} sessions)")
            for label, rec in latency(paths, feeds, level, args).items():
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


def main(argv: list[str] | None = None) -> None:
    tool_names = [t.name for t in _tools.all_tools()]
    corpus_names = [
        "resnet50",
        "mobilenetv3_large",
        "efficientnet_b0",
        "convnext_tiny",
        "bert_base",
        "distilbert",
        "gpt2",
        "vit_base",
    ]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument("--models", nargs="+", choices=corpus_names, default=corpus_names)
    parser.add_argument("--tools", nargs="+", choices=tool_names, default=tool_names)
    parser.add_argument("--iters", type=int, default=30, help="timed runs per session")
    parser.add_argument("--warmup", type=int, default=5, help="untimed runs per session")
    parser.add_argument("--repeat", type=int, default=3, help="optimize runs per tool (median)")
    parser.add_argument("--threads", type=int, default=2, help="intra_op_num_threads")
    parser.add_argument(
        "--tool-warmup", type=int, default=1, help="untimed optimize runs per tool first"
    )
    parser.add_argument("--tool-timeout", type=int, default=1800, help="seconds per tool")
    parser.add_argument("--json", type=Path, help="write every measurement here")
    parser.add_argument("--charts", type=Path, help="save PNG charts in this folder")
    parser.add_argument("--keep-models", type=Path, help="keep the optimized models here")
    parser.add_argument("--keep-times", action="store_true", help="every run time in the JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    corpus = args.corpus.expanduser()
    manifest = load_corpus(corpus, args.models)
    results = {
        "machine": _tools_report.machine(),
        "versions": _tools.versions(),
        "options": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "tools": {t.name: t.description for t in _tools.all_tools() if t.name in args.tools},
        "models": {},
    }
    print(_tools_report.header(results), flush=True)
    for name in args.models:
        progress(f"== {name}")
        results["models"][name] = bench_model(
            name, manifest["models"][name], corpus, args.tools, args
        )
        print(_tools_report.model_table(name, results["models"][name], args.tools), flush=True)
        if args.json:  # after every model: a crash later keeps what was measured
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(results, indent=1, default=str) + "\n")
    print(_tools_report.summary_tables(results), flush=True)
    if args.charts:
        for path in _tools_report.charts(results, args.charts):
            progress(f"chart: {path}")


if __name__ == "__main__":
    main()
