"""Latency of the encoder survey's exports: the original against the fused model, side by side.

Why: ``unseen_encoders.py`` counts what fuses on encoder, vision and speech families no
rule names (with the ``cpu-roofline`` profile, so every match shows); this says what the
fusion buys as a user gets it: the default profile (``cpu``), the check on, timed at
``ORT_ENABLE_ALL`` (onnxruntime's own fusions on), where a fused model only counts if it
is not slower than what onnxruntime does to the original by itself.

    python bench/corpus/unseen_encoders.py --out DIR FAMILY ...   # the exports
    python bench/corpus/bench_unseen_encoders_latency.py --exports DIR FAMILY ...

Each export ``DIR/{family}_{exporter}.onnx`` is optimized for onnxruntime (with
``--declared-too`` a second time with ``value_info: all``, every inferred intermediate
shape declared: the row ``declared``) and timed on one
seeded sample (``fusion_core.validate.random_inputs``: every symbolic axis whose name says
batch is ``--batch``, every other one ``--length``; a speech model wants ``--length
16000``), ``--threads`` threads, ``--rounds`` interleaved rounds after 20
(``bench/_interleaved.py``): per variant the median ms and the median ratio to the
original paired by round with p10-p90, and the largest difference of the first output.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/ for the shared loop

from _interleaved import interleaved_ms, paired_summary
from _sessions import feeds_for, session, short

ATTENTION = ("MultiHeadAttention", "GroupQueryAttention", "Attention")


def fuse(source: Path, target: Path, value_info: str | None = None) -> str:
    """Optimize ``source`` into ``target`` with the defaults (and ``value_info``, when
    given); what fused, in a few words."""
    from autofusion.fusion_core import OptimizeConfig, optimize

    config = OptimizeConfig(target="onnxruntime", value_info=value_info)
    result = optimize(onnx.load(str(source)), config)
    onnx.save(result.to_proto(), str(target))
    ops: dict[str, int] = {}
    for op, count in result.ops_after.items():
        ops[op.split("::")[-1]] = ops.get(op.split("::")[-1], 0) + count
    attention = sum(ops.get(op, 0) for op in ATTENTION)
    passed = result.check.passed if result.check else None
    return f"{attention} attention op(s), check {'passed' if passed else passed}"


def sample(path: Path, batch: int, length: int) -> dict[str, np.ndarray]:
    """One seeded sample: axes named for the batch at ``batch``, the others ``length``."""
    from autofusion.fusion_core.validate import describe_inputs, random_inputs

    model = onnx.load(str(path), load_external_data=False)
    symbols = {d for spec in describe_inputs(model) for d in spec.shape if isinstance(d, str)}
    dims = {s: batch if "batch" in s.lower() else length for s in symbols}
    return random_inputs(model, seed=0, dims=dims)


def timed_rows(family: str, paths: dict[str, Path], note: str, args) -> list[str]:
    """The table rows of one export: original and fused, interleaved."""
    feeds = sample(paths["original"], args.batch, args.length)
    sessions = {k: session(p, "ORT_ENABLE_ALL", args.threads) for k, p in paths.items()}
    feeds_of = {k: feeds_for(s, feeds) for k, s in sessions.items()}
    outputs = {k: s.run(None, feeds_of[k])[0] for k, s in sessions.items()}
    runs = {k: (lambda k=k, s=s: s.run(None, feeds_of[k])) for k, s in sessions.items()}
    summary = paired_summary(interleaved_ms(runs, warmup=20, iters=args.rounds), "original")
    rows = []
    for label, row in summary.items():
        diff = float(np.max(np.abs(outputs[label] - outputs["original"])))
        rows.append(
            f"| {family} | {label} | {note if label == 'after' else '-'} "
            f"| {row['median_ms']:.3f} | {row['paired_ratio']:.3f} "
            f"[{row['p10']:.3f}-{row['p90']:.3f}] | {diff:.1e} |"
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="+")
    default = Path.home() / ".cache/autofusion-corpus/unseen-encoders"
    parser.add_argument("--exports", type=Path, default=default)
    parser.add_argument("--out", type=Path, help="the fused models (EXPORTS/after)")
    parser.add_argument("--exporter", nargs="+", default=["torchscript", "dynamo"])
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=100)
    parser.add_argument(
        "--declared-too",
        action="store_true",
        help="also time the fused model written with value_info: all ('declared')",
    )
    args = parser.parse_args(argv)
    out = args.out or args.exports / "after"
    out.mkdir(parents=True, exist_ok=True)
    print("| family | variant | what fused | median ms | paired ratio [p10-p90] | max abs diff |")
    print("|---|---|---|---|---|---|")
    for family in args.families:
        for kind in args.exporter:
            original = args.exports / f"{family}_{kind}.onnx"
            name = f"{family} ({kind})"
            try:
                paths = {"original": original, "after": out / original.name}
                note = fuse(original, paths["after"])
                if args.declared_too:  # the same fusions, every inferred shape declared
                    paths["declared"] = out / f"declared_{original.name}"
                    fuse(original, paths["declared"], value_info="all")
                rows = timed_rows(name, paths, note, args)
            except Exception as exc:  # one export's failure is its row, not the table's end
                rows = [f"| {name} | - | {short(exc)} | - | - | - |"]
            print("\n".join(rows), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
