"""Prefill latency of the unseen families' exports: the original, a "before" fused model
(written by this script under another checkout of autofusion) and the fused model of
this checkout, timed side by side.

Why: ``unseen_families.py`` counts what fuses on families no rule names; this says what
that buys at ``ORT_ENABLE_ALL`` (onnxruntime's own fusions on), where a fusion only
counts if it beats what onnxruntime does to the original by itself.

    # the "before" models, under another checkout (PYTHONPATH as in docs/benchmarks.md):
    PYTHONPATH=/path/to/before python bench/corpus/bench_unseen_latency.py \\
        --write /tmp/before gpt_neo opt
    # then original, before and after, interleaved:
    python bench/corpus/bench_unseen_latency.py --before /tmp/before gpt_neo opt

Each family's prefill graph is the one ``unseen_families.py`` exported (its ``--out``
folder, the same default here; ``--exporter torchscript`` for a family dynamo cannot
export, such as MiniCPM3), optimized for onnxruntime with the default profile
(``cpu``) and the check on; timed on a batch of ``--batch`` rows of ``--seq`` tokens
(the last row padded from its second half), ``--threads`` threads, ``--rounds``
interleaved rounds after 20 (``bench/_interleaved.py``): per variant the median ms and
the median ratio to the original paired by round, with p10-p90, and the largest
difference of the logits from the original's.

``--sorted-dispatch`` fuses with the MoE router patterns copied with
``sorted_dispatch: true`` (experts dispatched by sorting tokens become ``MoE``; by
default they are kept): ``--write /tmp/default jetmoe`` under this checkout without it,
then ``--before /tmp/default --sorted-dispatch jetmoe`` times the default against it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ for the shared loop

from _interleaved import interleaved_ms, paired_summary
from _sessions import session


def sorted_dispatch_patterns() -> list[dict]:
    """The built-in MoE router patterns with ``mixture_of_experts``' param
    ``sorted_dispatch`` on, as a user registers them to fuse experts dispatched by
    sorting tokens (kept by default: docs/patterns.md)."""
    import json

    from autofusion.fusion_core.catalog import builtin_patterns, pattern_to_json

    found = []
    for pattern in builtin_patterns():
        spec = json.loads(pattern_to_json(pattern))
        if (spec.get("rewriter") or {}).get("name") == "mixture_of_experts":
            spec["name"] = f"{spec['name']}_sorted"
            spec["rewriter"].setdefault("params", {})["sorted_dispatch"] = True
            found.append(spec)
    return found


def fuse(source: Path, target: Path, extra: list[dict] | None = None) -> str:
    """Optimize ``source`` into ``target`` (with the ``extra`` patterns); what fused, in a
    few words."""
    import onnx

    from autofusion.fusion_core import OptimizeConfig, optimize

    config = OptimizeConfig(target="onnxruntime", extra_patterns=extra or [])
    result = optimize(onnx.load(str(source)), config)
    onnx.save(result.to_proto(), str(target))
    ops = {k.split("::")[-1]: v for k, v in result.ops_after.items()}
    attention = sum(ops.get(op, 0) for op in ("MultiHeadAttention", "GroupQueryAttention"))
    passed = result.check.passed if result.check else None
    moe = f", {ops['MoE']} MoE" if ops.get("MoE") else ""
    return f"{attention} attention op(s){moe}, check {'passed' if passed else passed}"


def feeds(batch: int, seq: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((batch, seq), np.int64)
    if batch > 1:
        mask[-1, seq // 2 :] = 0
    return {"input_ids": rng.integers(3, 256, (batch, seq)), "attention_mask": mask}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="+")
    parser.add_argument(
        "--exports", type=Path, default=Path.home() / ".cache/autofusion-corpus/unseen"
    )
    parser.add_argument("--write", type=Path, help="only write the fused models here")
    parser.add_argument("--before", type=Path, help="the folder --write filled elsewhere")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument(
        "--exporter", default="dynamo", help="torchscript for a family dynamo cannot export"
    )
    parser.add_argument(
        "--sorted-dispatch",
        action="store_true",
        help="fuse experts dispatched by sorting tokens too (the MoE router patterns with "
        "mixture_of_experts' sorted_dispatch on; with --before: against the default)",
    )
    args = parser.parse_args(argv)
    extra = sorted_dispatch_patterns() if args.sorted_dispatch else None
    out = args.write or Path(args.exports) / "after"
    out.mkdir(parents=True, exist_ok=True)
    sample = feeds(args.batch, args.seq)
    print("| family | variant | what fused | median ms | paired ratio [p10-p90] | max abs diff |")
    print("|---|---|---|---|---|---|")
    for family in args.families:
        original = args.exports / f"{family}_{args.exporter}.onnx"
        fused = out / original.name
        note = fuse(original, fused, extra)
        if args.write:
            print(f"{family}: {note}")
            continue
        paths = {"original": original, "after": fused}
        notes = {"original": "-", "after": note}
        if args.before:
            paths = {"original": original, "before": args.before / original.name, "after": fused}
            notes["before"] = "(see --write)"
        sessions = {k: session(p, "ORT_ENABLE_ALL", args.threads) for k, p in paths.items()}
        outputs = {k: s.run(None, sample)[0] for k, s in sessions.items()}
        runs = {k: (lambda s=s: s.run(None, sample)) for k, s in sessions.items()}
        summary = paired_summary(interleaved_ms(runs, warmup=20, iters=args.rounds), "original")
        for label, row in summary.items():
            diff = float(np.max(np.abs(outputs[label] - outputs["original"])))
            print(
                f"| {family} | {label} | {notes[label]} | {row['median_ms']:.3f} "
                f"| {row['paired_ratio']:.3f} [{row['p10']:.3f}-{row['p90']:.3f}] | {diff:.1e} |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
