"""What onnxruntime actually runs: each tool's output after onnxruntime's own optimizer.

At ``ORT_ENABLE_ALL`` onnxruntime fuses a lot itself when it loads a model, so two tools
whose files differ can deploy the same graph, and a latency difference between them is
then the machine's noise, not the tools. For every model of the benchmark corpus and
every tool (``bench/_tools.py``, each in a fresh process as ``bench_tools.py`` runs
them; ``--real-world``: the real-world corpus's entries, as there), this saves the graph
onnxruntime builds from the tool's output (``SessionOptions.optimized_model_filepath``
at ``--level``, one thread) and records its op types and counts, If/Loop bodies
included; outputs with the same counts are listed together.

    python bench/bench_deployed_graphs.py [--real-world [CACHE]] [--models ...] [--tools ...]
        [--level ORT_ENABLE_ALL] [--json deployed.json]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
from pathlib import Path

import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sessions
import _tools
import bench_tools

DEFAULT_TOOLS = (
    "ort-all",
    "onnxscript-ort-fusions",
    "onnxslim",
    "autofusion-ort-default",
    "autofusion-generic-default",
)


def deployed_ops(path: Path, level: str, scratch: Path) -> dict[str, int]:
    """The op counts of the graph onnxruntime runs for ``path`` at ``level``."""
    out = scratch / f"{path.stem}.deployed.onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.optimized_model_filepath = str(out)
    so.intra_op_num_threads = 1
    so.log_severity_level = 3
    ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    counts: collections.Counter = collections.Counter()
    graphs = [onnx.load(str(out), load_external_data=False).graph]
    while graphs:  # subgraphs too: silero-vad keeps its whole network in one If
        graph = graphs.pop()
        counts.update(bench_tools.op_key(n) for n in graph.node)
        for node in graph.node:
            for attr in node.attribute:
                graphs += [attr.g] if attr.HasField("g") else list(attr.graphs)
    return dict(sorted(counts.items()))


def model_row(name: str, entry: dict, corpus: Path, args: argparse.Namespace) -> dict:
    src = corpus / entry["file"]
    with tempfile.TemporaryDirectory(prefix=f"deployed-{name}-") as tmp:
        scratch = Path(tmp)
        found = {"original": {"ops": deployed_ops(src, args.level, scratch)}}
        for tool in args.tools:
            bench_tools.progress(f"{name}: {tool}")
            dst = scratch / f"{tool}.onnx"
            record = bench_tools.run_tool(tool, src, dst, entry, args)
            if record["status"] != "ok":
                found[tool] = {"error": record.get("error")}
                continue
            try:
                found[tool] = {"ops": deployed_ops(dst, args.level, scratch)}
            except Exception as err:  # an output onnxruntime cannot load
                found[tool] = {"error": _sessions.short(err)}
    same: dict[str, list[str]] = collections.defaultdict(list)
    for label, record in found.items():
        if "ops" in record:
            same[json.dumps(record["ops"])].append(label)
    for labels in same.values():
        for label in labels:
            found[label]["same_as"] = [other for other in labels if other != label]
    return found


def markdown(results: dict) -> str:
    lines = [
        f"| model | variant | nodes at {results['level']} (subgraphs included) "
        "| same deployed op counts as |",
        "| --- | --- | ---: | --- |",
    ]
    for name, variants in results["models"].items():
        for label, record in variants.items():
            if "ops" not in record:
                lines.append(f"| {name} | {label} | {record.get('error', '')[:120]} | |")
                continue
            same = ", ".join(record["same_as"]) or "-"
            lines.append(f"| {name} | {label} | {sum(record['ops'].values())} | {same} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    tool_names = [t.name for t in _tools.all_tools() if not t.once]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=bench_tools.DEFAULT_CORPUS)
    parser.add_argument("--real-world", nargs="?", const="", metavar="CACHE")
    parser.add_argument("--models", nargs="+", help="these models only (default: all)")
    parser.add_argument("--tools", nargs="+", choices=tool_names, default=list(DEFAULT_TOOLS))
    parser.add_argument("--level", default="ORT_ENABLE_ALL")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    # what bench_tools.run_tool reads: one untimed-free run per tool
    args.tool_warmup, args.repeat, args.tool_timeout = 0, 1, 1800
    args.threads, args.measure_budget = 1, 60.0
    corpus, entries = bench_tools.corpus_entries(args)
    results = {"level": args.level, "models": {}}
    for name, entry in entries.items():
        results["models"][name] = model_row(name, entry, corpus, args)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1) + "\n")
    print(markdown(results))


if __name__ == "__main__":
    main()
