"""Do autofusion's defaults make the deployed model faster, and which fusion does not?

For every corpus model (``bench/make_corpus.py``) and every default configuration:

* ``cli-generic`` / ``cli-ort``: ``OptimizeConfig()`` (priority selection, profile
  ``cpu``) for the target generic / onnxruntime, as ``autofusion optimize`` runs it;
* ``preset-generic`` / ``preset-ort``: the service's ``default`` preset (selection
  ``auto`` on every pattern), reproducible as ``OptimizeConfig(selection="auto")``;

the model is fused (check off: the timing below compares outputs' speed only) with no
input shapes given, as a user who passes no ``--shape`` gets it, or with the corpus's
shapes (``--shapes``). With ``--ablate``, every group of applied fusions (grouped by
rewriter: one rewriter emits one kind of kernel, and the cost model's kernel factors
are per rewriter) is also left out in turn (``exclude`` = every pattern of that
rewriter), so each group's own effect on the deployed model is measured;
``--leave-out NAME=GLOB,...`` leaves out any set of patterns by name (``all=*``: the
pre-passes alone).

Then the original and every distinct variant run in onnxruntime at ``--level``
(default ``ORT_ENABLE_ALL``, what a user deploys), CPU, for each ``--threads`` count.
Each comparison is timed on its own (on a shared 2-core machine the runs of one pair
must be close in time to see the same load, which a loop over every variant is not),
in ``--sessions`` rounds with a fresh session of each model (two sessions of one and
the same model differ by a few percent), in blocks of adjacent runs A B B A
(``--warmup`` untimed blocks per round, ``--iters`` timed blocks in all). Each run is
timed by the ``--clock``: ``cpu`` (default) reads the CPU time of the thread that runs
the session (1 intra-op thread: onnxruntime runs every kernel on the caller's thread),
so the time other processes held the core is not counted; with more threads, the
process's CPU time (all threads' work, not the latency); ``wall`` reads the wall
clock. A block's ratio is min(A) / min(B); over the blocks, the median, its 95%
sign-test interval and a verdict (``fusion_core.profiling``'s PairedRatio):

* ``default / original``: below 1, the default is faster than the original;
* ``with group / without group`` (``--ablate``): below 1, that group of fusions makes
  the deployed model faster; above 1, it makes it slower.

    python bench/bench_defaults.py [--models resnet50 gpt2 ...] [--configs cli-ort ...]
        [--ablate] [--leave-out NAME=GLOB,...] [--shapes] [--threads 1 2]
        [--iters 24] [--sessions 3] [--warmup 2] [--clock cpu] [--json out.json]
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import gc
import hashlib
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _sessions
import bench_tools

from autofusion.fusion_core import CheckOptions, OptimizeConfig, builtin_patterns, optimize
from autofusion.fusion_core.profiling import paired_ratio  # the report's PairedRatio (public there)

logger = logging.getLogger("bench_defaults")

CONFIGS: dict[str, dict[str, Any]] = {
    "cli-generic": {"target": "generic"},
    "cli-ort": {"target": "onnxruntime"},
    "preset-generic": {"target": "generic", "selection": "auto"},
    "preset-ort": {"target": "onnxruntime", "selection": "auto"},
}
MODELS = [
    "resnet50",
    "mobilenetv3_large",
    "efficientnet_b0",
    "convnext_tiny",
    "densenet121",
    "bert_base",
    "distilbert",
    "gpt2",
    "vit_base",
]


def progress(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def patterns_by_rewriter(target: str) -> dict[str, list[str]]:
    groups: dict[str, list[str]] = collections.defaultdict(list)
    for p in builtin_patterns():
        if target in p.spec.targets:
            groups[p.spec.rewriter.name].append(p.name)
    return dict(groups)


def fuse(src: Path, overrides: dict[str, Any], dims: dict[str, int], out: Path) -> dict:
    """Optimize ``src`` with ``overrides`` (check off), save to ``out``, describe it."""
    config = OptimizeConfig(check=CheckOptions(enabled=False, dims=dims), **overrides)
    start = time.perf_counter()
    result = optimize(str(src), config)
    seconds = time.perf_counter() - start
    proto = result.to_proto()
    data = proto.SerializeToString()
    out.write_bytes(data)
    by_rewriter: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    predicted: dict[str, float] = collections.Counter()
    for fusion in result.applied:
        by_rewriter[fusion.rewriter or "?"][fusion.pattern] += 1
        saved = (fusion.predicted_gain or {}).get("saved_us")
        predicted[fusion.rewriter or "?"] += saved or 0.0
    near = [m for m in result.near_misses if "selection" in m.reason or "deploy" in m.reason]
    return {
        "path": str(out),
        "sha": hashlib.sha256(data).hexdigest()[:16],
        "optimize_s": round(seconds, 2),
        "nodes": len(proto.graph.node),
        "groups": {k: dict(v) for k, v in sorted(by_rewriter.items())},
        "predicted_saved_us": {k: round(v, 1) for k, v in sorted(predicted.items())},
        "selection_near_misses": collections.Counter(m.pattern for m in near),
    }


def build_variants(name: str, entry: dict, corpus: Path, args, tmp: Path) -> dict[str, dict]:
    src = corpus / entry["file"]
    dims = bench_tools_dims(src, entry) if args.shapes else {}
    variants: dict[str, dict] = {}
    for cname in args.configs:
        overrides = CONFIGS[cname]
        full = fuse(src, overrides, dims, tmp / f"{cname}.onnx")
        full["config"], full["excluded"] = cname, None
        variants[cname] = full
        progress(f"  {cname}: {full['groups']} ({full['optimize_s']} s)")
        for group, excluded in leave_outs(full, overrides["target"], args).items():
            label = f"{cname} -{group}"
            out = tmp / f"{cname}-no-{len(variants)}.onnx"
            exclude = [*overrides.get("exclude", []), *excluded]
            variant = fuse(src, {**overrides, "exclude": exclude}, dims, out)
            variant["config"], variant["excluded"] = cname, group
            variants[label] = variant
            progress(f"  {label}: {variant['groups']}")
    return variants


def leave_outs(full: dict, target: str, args) -> dict[str, list[str]]:
    """Group name -> the patterns to exclude: each applied rewriter's (``--ablate``) and
    each ``--leave-out NAME=GLOB,...`` (pattern-name globs; ``all=*``: pre-passes only)."""
    names = [p.name for p in builtin_patterns() if target in p.spec.targets]
    groups: dict[str, list[str]] = {}
    if args.ablate:
        by_rewriter = patterns_by_rewriter(target)
        groups |= {g: by_rewriter.get(g, []) for g in full["groups"]}
    for spec in args.leave_out:
        label, _, globs = spec.partition("=")
        chosen = [n for n in names if any(fnmatch.fnmatch(n, g) for g in globs.split(","))]
        applied = {p for patterns in full["groups"].values() for p in patterns}
        if applied & set(chosen):  # leaving out what was not applied changes nothing
            groups[label] = chosen
    return groups


def bench_tools_dims(src: Path, entry: dict) -> dict[str, int]:
    dims = {}
    model = onnx.load(str(src), load_external_data=False)
    for value in model.graph.input:
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if dim.dim_param and value.name in entry.get("input_shapes", {}):
                dims[dim.dim_param] = int(entry["input_shapes"][value.name][axis])
    return dims


# With one intra-op thread onnxruntime runs every kernel on the calling thread, so that
# thread's CPU time is the run's compute time without the time other processes held the
# core (on this shared 2-core machine a run's wall time swings by 2x under their load);
# with more threads, the process's CPU time (all its threads' work, not the latency).
CLOCKS = {
    "cpu": lambda threads: time.thread_time if threads == 1 else time.process_time,
    "wall": lambda threads: time.perf_counter,
}


def comparisons(variants: dict[str, dict]) -> dict[str, tuple[str, str]]:
    """label -> (treatment, baseline): a default against the original, a default with a
    group against the same default without it (below 1: the group makes it faster)."""
    pairs = {}
    for label, v in variants.items():
        if v["excluded"] is None:
            pairs[label] = (label, "original")
        else:
            pairs[label] = (v["config"], label)
    return pairs


def time_pairs(
    src: Path, variants: dict[str, dict], feeds: dict, level: str, threads: int, args
) -> dict[str, dict]:
    """Each comparison on its own, in ``--sessions`` rounds, each with a fresh session
    of both models: ``--warmup`` then ``--iters`` / rounds blocks of A B B A runs. A
    block's ratio is min(A) / min(B) (a run another process slowed is only ever slower,
    so the faster of two adjacent runs is the better reading). Fresh sessions per round:
    two sessions of one and the same model differ by a few percent (where the arena
    places the tensors), which pairing runs within one session pair cannot see."""
    paths = {"original": src}
    label_of_sha: dict[str, str] = {}
    for label, v in variants.items():
        label_of_sha.setdefault(v["sha"], label)
        paths[label_of_sha[v["sha"]]] = Path(v["path"])

    def canonical(label: str) -> str:
        return label if label == "original" else label_of_sha[variants[label]["sha"]]

    out, done = {}, {}
    for label, (a, b) in comparisons(variants).items():
        key = (canonical(a), canonical(b))
        if key[0] == key[1]:
            out[label] = {"against": b, "identical": True, "paired": None}
            continue
        if key not in done:
            a_ms, b_ms = time_pair(paths[key[0]], paths[key[1]], feeds, level, threads, args)
            ratio = paired_ratio(a_ms, b_ms)
            done[key] = {
                "paired": ratio.to_dict() if ratio else None,
                "a_median_ms": float(np.median(a_ms)),
                "b_median_ms": float(np.median(b_ms)),
            }
        out[label] = {"against": b, "identical": False, **done[key]}
    return out


def time_pair(
    a: Path, b: Path, feeds: dict, level: str, threads: int, args
) -> tuple[list[float], list[float]]:
    """Per block, the faster of A's two runs and of B's (ms), over every round."""
    clock = CLOCKS[args.clock](threads)
    a_ms: list[float] = []
    b_ms: list[float] = []
    blocks = max(args.iters // args.sessions, 1)
    for _ in range(args.sessions):
        runs = []
        for path in (a, b):
            sess = _sessions.session(path, level, threads)
            runs.append((sess, _sessions.feeds_for(sess, feeds)))

        def run_ms(k: int, runs=runs) -> float:
            sess, inputs = runs[k]
            start = clock()
            sess.run(None, inputs)
            return (clock() - start) * 1000

        for i in range(args.warmup + blocks):
            block = [run_ms(0), run_ms(1), run_ms(1), run_ms(0)]
            if i >= args.warmup:
                a_ms.append(min(block[0], block[3]))
                b_ms.append(min(block[1], block[2]))
        del runs
        gc.collect()
    return a_ms, b_ms


def bench_model(name: str, corpus: Path, manifest: dict, args) -> dict:
    entry = manifest["models"][name]
    src = corpus / entry["file"]
    with np.load(corpus / entry["inputs_file"]) as data:
        feeds = {k: data[k] for k in data.files}
    record: dict[str, Any] = {"variants": {}, "timing": {}}
    with tempfile.TemporaryDirectory(prefix=f"bench-defaults-{name}-") as tmp:
        variants = build_variants(name, entry, corpus, args, Path(tmp))
        record["variants"] = {
            k: {x: y for x, y in v.items() if x != "path"} for k, v in variants.items()
        }
        for threads in args.threads:
            result = time_pairs(src, variants, feeds, args.level, threads, args)
            record["timing"][str(threads)] = result
            for label, r in result.items():
                p = r["paired"]
                text = (
                    "identical models"
                    if p is None
                    else (f"{p['median']:.3f} [{p['low']:.3f}-{p['high']:.3f}] {p['verdict']}")
                )
                progress(f"  {threads} thr {label:40s} vs {r['against']:22s} {text}")
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, default=bench_tools.DEFAULT_CORPUS)
    parser.add_argument("--models", nargs="+", default=MODELS)
    parser.add_argument(
        "--define",
        nargs="+",
        default=[],
        metavar="NAME=JSON",
        help="more configs: OptimizeConfig fields as JSON, e.g. "
        'old-ort=\'{"target": "onnxruntime", "target_profile": "cpu-roofline"}\'',
    )
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS))
    parser.add_argument("--ablate", action="store_true", help="leave each rewriter out in turn")
    parser.add_argument(
        "--leave-out",
        nargs="+",
        default=[],
        metavar="NAME=GLOB,...",
        help="also leave out these patterns (name globs), e.g. pre_ln='skip_layer_norm*pre_ln*'",
    )
    parser.add_argument("--shapes", action="store_true", help="give the corpus's input shapes")
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--level", default="ORT_ENABLE_ALL")
    parser.add_argument("--iters", type=int, default=24, help="timed blocks in all")
    parser.add_argument(
        "--sessions", type=int, default=3, help="fresh session pairs per comparison"
    )
    parser.add_argument("--warmup", type=int, default=2, help="untimed blocks per round")
    parser.add_argument(
        "--clock", choices=list(CLOCKS), default="cpu", help="cpu: CPU time (see CLOCKS)"
    )
    parser.add_argument("--json", type=Path, help="write every measurement here")
    args = parser.parse_args(argv)
    for spec in args.define:
        name, _, fields = spec.partition("=")
        CONFIGS[name] = json.loads(fields)
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown:
        parser.error(f"unknown configs {unknown}: define them with --define NAME=JSON")
    logging.basicConfig(level=logging.WARNING)
    corpus = args.corpus.expanduser()
    manifest = json.loads((corpus / "manifest.json").read_text())
    out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "models": {}}
    for name in args.models:
        if name not in manifest["models"]:
            progress(f"{name}: not in the corpus ({corpus}); run bench/make_corpus.py")
            continue
        progress(f"{name}:")
        out["models"][name] = bench_model(name, corpus, manifest, args)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
