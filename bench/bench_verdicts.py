"""What the verdict store saves, and whether what it reuses is right (issue 28).

For pairs of corpus models of one family (the second another exporter, attention
implementation or checkpoint of the first's blocks), on this machine, in one process:

1. **first**: measured selection on A with an empty store (every group timed);
2. **repeat**: A again with that store (its verdicts reused);
3. **sibling**: B with the same store (the groups whose region signatures A measured
   are reused, the rest timed), and **sibling cold**: B with an empty store;
4. **fresh**: A again with an empty store, a new measurement made for the comparison.

Agreement: each decision taken from the store in 2 and 3 (kept or left out) against the
decision the fresh measurement of the same group took (4 for A, "sibling cold" for B);
groups the fresh run did not time (its budget did not reach them) are not counted.
``seconds`` is measured selection's own wall time (``Result.measurement["seconds"]``).

    python bench/bench_verdicts.py [--budget 20] [--threads 1] [--pairs a:b ...]
        [--json results.json]

Needs the corpus cache (``make .venv/.corpus-installed``, ``bench/corpus/build.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
from pathlib import Path

from autofusion.fusion_core import OptimizeConfig
from autofusion.fusion_core.catalog import builtin_patterns
from autofusion.fusion_core.pipeline.measured import optimize_measured

CORPUS = Path(os.environ.get("AUTOFUSION_CORPUS_DIR", Path.home() / ".cache/autofusion-corpus"))
PAIRS = [
    ("mtcnn_rnet", "mtcnn_onet"),
    ("yolov8n_dynamo", "yolov8n_torchscript"),
    ("whisper_encoder_eager_dynamo", "whisper_encoder_sdpa_dynamo"),
    ("swin_eager_dynamo", "swin_eager_torchscript"),
    ("t5_encoder_eager_dynamo", "t5_encoder_eager_torchscript"),
    ("modernbert_eager_dynamo", "modernbert_sdpa_dynamo"),
    ("llm_llama_dynamo", "llm_mistral_dynamo"),
]


def measured(name: str, store: Path, args: argparse.Namespace, patterns) -> dict:
    config = OptimizeConfig(
        target="onnxruntime",
        selection="measured",
        check={"enabled": False},  # the same fixed cost in every run: not what is compared
        measure_options={
            "cache_dir": str(store),
            "budget_s": args.budget,
            "threads": args.threads,
        },
    )
    result = optimize_measured(CORPUS / "models" / name / "model.onnx", config, patterns=patterns)
    record = result.measurement
    return {
        "model": name,
        "seconds": record["seconds"],
        "store": record.get("store") or {},
        "groups": {
            g["group"]: {
                "kept": g["kept"],
                "source": g.get("source"),
                "verdict": (g.get("ratio") or {}).get("verdict"),
            }
            for g in record["groups"]
        },
    }


def agreement(reused: dict, fresh: dict) -> tuple[int, int, int]:
    """(decisions compared, the same decision, the same verdict) for the reused groups."""
    compared = same = same_verdict = 0
    for key, group in reused["groups"].items():
        other = fresh["groups"].get(key)
        if group["source"] != "store" or other is None or other["source"] != "measured":
            continue
        compared += 1
        same += group["kept"] == other["kept"]
        same_verdict += group["verdict"] == other["verdict"]
    return compared, same, same_verdict


def run_pair(first: str, second: str, args: argparse.Namespace, patterns) -> dict:
    with tempfile.TemporaryDirectory() as shared, tempfile.TemporaryDirectory() as scratch:
        runs = {"first": measured(first, Path(shared), args, patterns)}
        runs["repeat"] = measured(first, Path(shared), args, patterns)
        runs["sibling"] = measured(second, Path(shared), args, patterns)
        runs["sibling_cold"] = measured(second, Path(scratch) / "b", args, patterns)
        runs["fresh"] = measured(first, Path(scratch) / "a", args, patterns)
    runs["agree_repeat"] = agreement(runs["repeat"], runs["fresh"])
    runs["agree_sibling"] = agreement(runs["sibling"], runs["sibling_cold"])
    return runs


def row(runs: dict) -> str:
    first, repeat, sibling, cold = (runs[k] for k in ("first", "repeat", "sibling", "sibling_cold"))
    reused = sibling["store"].get("matched", 0)
    timed = sibling["store"].get("measured", 0)
    compared = runs["agree_repeat"][0] + runs["agree_sibling"][0]
    same = runs["agree_repeat"][1] + runs["agree_sibling"][1]
    return (
        f"| {first['model']} | {first['seconds']:.1f} | {repeat['seconds']:.1f} "
        f"({first['seconds'] / max(repeat['seconds'], 1e-9):.1f}x) | {sibling['model']} | "
        f"{cold['seconds']:.1f} | {sibling['seconds']:.1f} ({reused} reused, {timed} timed) | "
        f"{same}/{compared} |"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=20.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pairs", nargs="*", help="first:second corpus model names")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    pairs = [tuple(p.split(":", 1)) for p in args.pairs] if args.pairs else PAIRS
    patterns = builtin_patterns()
    print(f"# {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"budget {args.budget:g} s, {args.threads} thread(s)")  # fmt: skip
    print("| first model | first s | repeat s | sibling | sibling cold s | sibling with "
          "store s | reused decisions that agree |")  # fmt: skip
    print("| --- | ---: | ---: | --- | ---: | ---: | ---: |")
    results, compared, same, same_verdict = [], 0, 0, 0
    for first, second in pairs:
        runs = run_pair(first, second, args, patterns)
        results.append(runs)
        print(row(runs), flush=True)
        for key in ("agree_repeat", "agree_sibling"):
            compared += runs[key][0]
            same += runs[key][1]
            same_verdict += runs[key][2]
    if compared:
        print(f"\nreused decisions that a fresh measurement agreed with: {same}/{compared} "
              f"({same / compared:.0%}); the same verdict: {same_verdict}/{compared}")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
