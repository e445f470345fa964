"""Does the cost model rank fusions the way onnxruntime's timings do?

For ResNet-50 and BERT-base (random weights, nothing downloaded; exported once with
torch's dynamo exporter into ``--models``, outside the repository), one run:

1. ``fusion_core.optimize`` for the onnxruntime target (check off). Every applied fusion
   carries the cost model's ``predicted_gain`` on ``--target-profile`` (µs per run).
2. ``fusion_core.profiling.profile_models`` at ORT_DISABLE_ALL, ``--repeat`` times: each
   fused region's kernel time against the summed kernel times of the original nodes it
   replaced, from onnxruntime's profiler. The measured gain of a region is the median
   over the repeats of ``before_us - after_us``.
3. A fusion that later fusions built on (Conv+BN folded, then its Relu joined) is one
   region in the end: its prediction is the sum over the chain of fusions.
4. Prints, per model: Spearman's rank correlation between predicted and measured gain
   over the regions, how often the two agree on the sign, and per pattern the summed
   prediction against the summed measurement.
5. With ``--fit``: kernel factors are learned from those reports
   (``fusion_core.cost.fit``, as ``autofusion calibrate --from-report`` does), and both
   models are measured again at a second input shape (ResNet-50 at 288x288, BERT at
   sequence 384), so the factors are judged on shapes they were not fitted on: ranking
   and sign agreement with the shipped profile and with the fitted one, and the latency
   of the model fused with priority selection against the model fused with greedy
   selection on the fitted profile (which leaves out the fusions it predicts to lose),
   interleaved runs, medians, at ORT_DISABLE_ALL and ORT_ENABLE_ALL.

    python bench/bench_cost_vs_measured.py [--models DIR] [--repeat 3] [--threads 1]
        [--node-runs 10] [--target-profile cpu] [--fit] [--json results.json]

Needs the ``torch`` extra (the exporters in bench/make_*_models.py).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize, save_model
from autofusion.fusion_core.cost import dump_target_profile, load_target_profile
from autofusion.fusion_core.cost.fit import fit_kernel_factors
from autofusion.fusion_core.profiling import ProfileOptions, measure_latency, profile_models
from autofusion.fusion_core.report import build_report

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _tools import symbolic_dims  # bench/ is not a package: found through sys.path

DEFAULT_MODELS = Path.home() / ".cache" / "autofusion-bench"
IMAGE = {"a": 224, "b": 288}
SEQUENCE = {"a": 128, "b": 384}


def resnet50(folder: Path, shape: str) -> tuple[Path, dict[str, np.ndarray]]:
    size = IMAGE[shape]
    path = folder / f"resnet50_{size}_dynamo.onnx"
    if not path.exists():
        import make_resnet_models as mrm

        mrm.generate(folder, f"resnet50_{size}", width=1.0, size=size, num_classes=1000)
    x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)
    return path, {onnx.load(path, load_external_data=False).graph.input[0].name: x}


def bert_base(folder: Path, shape: str) -> tuple[Path, dict[str, np.ndarray]]:
    """Exported once with a dynamic sequence axis; the feeds pick the sequence length."""
    path, feeds_path = folder / "bert_eager_dynamo.onnx", folder / "bert_eager_feeds.npz"
    if not path.exists() or not feeds_path.exists():
        import bench_transformers as bt

        feeds, _, dynamic = bt.export("bert", "eager", path)
        if not dynamic:
            raise SystemExit("BERT exported with static shapes: cannot vary the sequence")
        np.savez(feeds_path, **feeds)
    with np.load(feeds_path) as data:
        exported = {name: data[name] for name in data.files}
    rng = np.random.default_rng(0)
    sequence = SEQUENCE[shape]
    feeds = {}
    for name, array in exported.items():
        if name == "input_ids":  # below BERT-base's vocabulary (30522)
            feeds[name] = rng.integers(0, 30522, (1, sequence)).astype(array.dtype)
        else:  # the attention mask (and token types): ones / zeros as exported
            feeds[name] = np.full((1, sequence), array.flat[0], dtype=array.dtype)
    return path, feeds


MODELS = {"resnet50": resnet50, "bert-base": bert_base}


def dims_of(path: Path, feeds: dict[str, np.ndarray]) -> dict[str, int]:
    """Values for the graph's symbolic dimensions, read off the feeds."""
    return symbolic_dims(path, {name: array.shape for name, array in feeds.items()})


def spearman(a: list[float], b: list[float]) -> float | None:
    """Spearman's rho (average ranks for ties); None for fewer than 3 pairs."""
    if len(a) < 3:
        return None
    return float(np.corrcoef(_ranks(a), _ranks(b))[0, 1])


def _ranks(values: list[float]) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    sorted_values = np.asarray(values)[order]
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and sorted_values[j + 1] == sorted_values[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2
        i = j + 1
    return ranks


def chain_prediction(entries: list[dict], index: int) -> float | None:
    """Predicted µs saved by fusion ``index`` and every earlier fusion it built on."""
    own = (entries[index].get("predicted_gain") or {}).get("saved_us")
    if own is None:
        return None
    total = own
    for earlier in entries[index]["provenance"]["from_fusions"]:
        part = chain_prediction(entries, earlier)
        if part is None:
            return None
        total += part
    return total


def _chain(entries: list[dict], index: int) -> list[int]:
    earlier = [i for e in entries[index]["provenance"]["from_fusions"] for i in _chain(entries, e)]
    return earlier + [index]


def _config(profile: str, dims: dict[str, int], selection: str = "priority") -> OptimizeConfig:
    return OptimizeConfig(
        target="onnxruntime",
        selection=selection,
        target_profile=profile,
        check=CheckOptions(enabled=False, dims=dims),
    )


def measure(
    path: Path, feeds: dict, profiles: list[str], args: argparse.Namespace
) -> tuple[dict[str, list[dict]], list[dict]]:
    """Regions (predicted on each profile, measured) and the profiled reports."""
    dims = dims_of(path, feeds)
    # Priority selection: the fused model is the same whatever profile prices it.
    results = {p: optimize(path, _config(p, dims)) for p in profiles}
    options = ProfileOptions(
        threads=args.threads,
        warmup=2,
        iters=3,
        node_runs=args.node_runs,
        levels=("ORT_DISABLE_ALL",),
        dims=dims,
    )
    measured: dict[int, list[float]] = defaultdict(list)  # fusion index -> saved µs per repeat
    reports = []
    first = results[profiles[0]]
    with tempfile.TemporaryDirectory(prefix="autofusion-bench-") as scratch:
        fused = Path(scratch) / "fused.onnx"
        save_model(first.model, fused)
        for _ in range(args.repeat):
            profile = profile_models(path, fused, feeds=feeds, options=options).to_dict()
            reports.append(build_report(first, profile=profile))
            for entry in reports[-1]["applied"]:
                saved = (entry.get("measured_gain") or {}).get("saved_us")
                if saved is not None:
                    measured[entry["index"]].append(saved)
    rows: dict[str, list[dict]] = {}
    for name, result in results.items():
        entries = build_report(result, profile=reports[-1]["profile"])["applied"]
        rows[name] = []
        for index, saved in sorted(measured.items()):
            predicted = chain_prediction(entries, index)
            if predicted is not None:
                chain = [entries[i]["pattern"] for i in _chain(entries, index)]
                rows[name].append(
                    {
                        "chain": chain,
                        "predicted_us": predicted,
                        "measured_us": statistics.median(saved),
                    }
                )
    return rows, reports


def summary(rows: list[dict]) -> dict:
    predicted = [r["predicted_us"] for r in rows]
    measured = [r["measured_us"] for r in rows]
    agree = sum((p > 0) == (m > 0) for p, m in zip(predicted, measured, strict=True))
    by_pattern: dict[str, dict] = {}
    for row in rows:
        group = by_pattern.setdefault(
            " + ".join(row["chain"]), {"regions": 0, "predicted_us": 0.0, "measured_us": 0.0}
        )
        group["regions"] += 1
        group["predicted_us"] += row["predicted_us"]
        group["measured_us"] += row["measured_us"]
    groups = list(by_pattern.values())
    return {
        "regions": len(rows),
        "spearman_regions": spearman(predicted, measured),
        "spearman_patterns": spearman(
            [g["predicted_us"] for g in groups], [g["measured_us"] for g in groups]
        ),
        "sign_agreement": agree / len(rows) if rows else None,
        "patterns": by_pattern,
    }


def latency(path: Path, feeds: dict, fitted: str, args: argparse.Namespace) -> dict:
    """Original, priority-fused and cost-selected (fitted profile) models, interleaved."""
    dims = dims_of(path, feeds)
    priority = optimize(path, _config(args.target_profile, dims))
    chosen = optimize(path, _config(fitted, dims, selection="greedy"))
    left_out = sorted(
        {m.pattern for m in chosen.near_misses if "gain <= 0" in m.reason}
        | (set(priority.counts) - set(chosen.counts))
    )
    options = ProfileOptions(threads=args.threads, warmup=3, iters=args.latency_iters)
    with tempfile.TemporaryDirectory(prefix="autofusion-bench-") as scratch:
        models = {"original": str(path)}
        for label, result in (("priority", priority), ("cost-selected", chosen)):
            models[label] = str(Path(scratch) / f"{label}.onnx")
            save_model(result.model, models[label])
        levels = {}
        for level in ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL"):
            comparison = measure_latency(models, feeds, level=level, options=options)
            levels[level] = {s.label: s.median_ms for s in comparison.sessions}
    return {
        "priority_fusions": priority.counts,
        "cost_selected_fusions": chosen.counts,
        "left_out": left_out,
        "median_ms": levels,
    }


def markdown(results: dict, args: argparse.Namespace) -> str:
    lines = [
        f"onnxruntime {ort.__version__}, {platform.machine()}, {args.threads} thread(s), "
        f"{args.repeat} repeats x {args.node_runs} traced runs at ORT_DISABLE_ALL",
        "",
        "| model | shape | profile | regions | Spearman (regions) | Spearman (patterns) "
        "| sign agrees |",
        "|---|---|---|---:|---:|---:|---:|",
    ]
    for key, s in results["summaries"].items():
        model, shape, profile = key.split("|")
        lines.append(
            f"| {model} | {shape} | {profile} | {s['regions']} | {_f(s['spearman_regions'])} "
            f"| {_f(s['spearman_patterns'])} | {_pct(s['sign_agreement'])} |"
        )
    for key, s in results["summaries"].items():
        lines += [
            "",
            f"{key.replace('|', ', ')}: per chain of fusions ending in one region, µs per run",
            "",
            "| fusions | regions | predicted saved | measured saved |",
            "|---|---:|---:|---:|",
        ]
        ranked = sorted(s["patterns"].items(), key=lambda kv: -kv[1]["measured_us"])
        for chain, g in ranked:
            lines.append(
                f"| {chain} | {g['regions']} | {g['predicted_us']:.1f} | {g['measured_us']:.1f} |"
            )
    for model, entry in results.get("latency", {}).items():
        lines += [
            "",
            f"{model} at the second shape: median ms ({args.latency_iters} interleaved runs); "
            f"the fitted profile leaves out {', '.join(entry['left_out']) or 'nothing'}",
            "",
            "| level | original | priority | cost-selected | cost-selected / priority |",
            "|---|---:|---:|---:|---:|",
        ]
        for level, m in entry["median_ms"].items():
            lines.append(
                f"| {level} | {m['original']:.2f} | {m['priority']:.2f} | "
                f"{m['cost-selected']:.2f} | {m['cost-selected'] / m['priority']:.3f} |"
            )
    if "factors" in results:
        lines += ["", f"fitted kernel factors (scale {results['scale']:.3g}):", ""]
        lines += [f"- {name}: {value:.3g}" for name, value in results["factors"].items()]
    return "\n".join(lines)


def _f(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=DEFAULT_MODELS, help="model cache folder")
    parser.add_argument("--only", nargs="*", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--repeat", type=int, default=3, help="profiles per model (median)")
    parser.add_argument("--node-runs", type=int, default=10, help="traced runs per profile")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--target-profile", default="cpu")
    parser.add_argument("--fit", action="store_true", help="fit kernel factors, test at shape b")
    parser.add_argument("--latency-iters", type=int, default=20)
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    args = parser.parse_args(argv)
    args.models.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    results: dict = {"summaries": {}}
    all_reports = []
    for name in args.only:
        path, feeds = MODELS[name](args.models, "a")
        rows, reports = measure(path, feeds, [args.target_profile], args)
        all_reports += reports
        results["summaries"][f"{name}|a|{args.target_profile}"] = summary(rows[args.target_profile])
    if args.fit:
        scale, fitted = fit_kernel_factors(all_reports)
        results["scale"] = scale
        results["factors"] = {f.rewriter: f.factor for f in fitted}
        base = load_target_profile(args.target_profile)
        profile = base.model_copy(update={"name": "fitted", "kernel_factors": results["factors"]})
        fitted_path = args.models / "fitted_profile.yaml"
        fitted_path.write_text(dump_target_profile(profile), encoding="utf-8")
        results["latency"] = {}
        for name in args.only:
            path, feeds = MODELS[name](args.models, "b")
            rows, _ = measure(path, feeds, [args.target_profile, str(fitted_path)], args)
            for profile_name, label in (
                (args.target_profile, args.target_profile),
                (str(fitted_path), "fitted"),
            ):
                results["summaries"][f"{name}|b|{label}"] = summary(rows[profile_name])
            results["latency"][name] = latency(path, feeds, str(fitted_path), args)
    results["seconds"] = time.perf_counter() - start
    print(markdown(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
