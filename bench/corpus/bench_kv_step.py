"""One decode step of KV-cache graphs, timed side by side: each variant against a base.

Why: a KV graph's fusions decide the decode step's latency, and variants of one graph
(the original, fused one way, fused another) are compared in one process, interleaved
(``bench/_interleaved.py``), as paired ratios with their spread. The step is a batch of
``--batch`` rows after ``--past`` cached positions, the last row left-padded by ``--pad``
(its positions shifted back), the past states random: the surveys' KV graphs
(``unseen_families.py --kv``) and optimum's take these inputs (``input_ids``,
``attention_mask``, ``position_ids`` where the graph has it, and every other input a past
state whose free axes are the batch, then the past length).

    python bench/corpus/bench_kv_step.py original=M.onnx mha=A.onnx gqa=B.onnx \\
        --base mha --past 100 --rounds 3000

Prints each variant's largest difference from the first one's outputs (a variant that
computes something else is no variant), then its median ms and the paired ratio to the
base with p10-p90.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _interleaved import interleaved_ms, paired_summary
from _sessions import session

_TOKENS = {"input_ids", "attention_mask", "position_ids"}


def step_feeds(model: onnx.ModelProto, batch: int, past: int, pad: int, seed: int = 0) -> dict:
    """The inputs of one decode step of ``model`` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    mask = np.ones((batch, past + 1), np.int64)
    mask[-1, :pad] = 0
    feeds = {
        "input_ids": rng.integers(3, 200, (batch, 1)),
        "attention_mask": mask,
        "position_ids": (mask.cumsum(-1) - 1)[:, -1:],
    }
    names = {i.name for i in model.graph.input}
    feeds = {k: v for k, v in feeds.items() if k in names}
    for value in model.graph.input:
        if value.name in _TOKENS:
            continue
        free = iter((batch, past))
        shape = value.type.tensor_type.shape.dim
        dims = [d.dim_value if d.dim_value else next(free, 1) for d in shape]
        feeds[value.name] = rng.standard_normal(dims).astype(np.float32)
    return feeds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("variants", nargs="+", help="LABEL=PATH, the first the reference")
    parser.add_argument("--base", help="the label ratios are to (default: the first)")
    parser.add_argument("--past", type=int, default=100)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--pad", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    paths = dict(v.split("=", 1) for v in args.variants)
    first = next(iter(paths))
    model = onnx.load(paths[first], load_external_data=False)
    feeds = step_feeds(model, args.batch, args.past, args.pad)
    sessions = {k: session(Path(p), "ORT_ENABLE_ALL", args.threads) for k, p in paths.items()}
    outs = {k: s.run(None, feeds) for k, s in sessions.items()}
    for label, got in outs.items():
        worst = max(float(np.abs(a - b).max()) for a, b in zip(got, outs[first], strict=True))
        print(f"{label}: largest difference from {first}: {worst:.3g}")
    runs = {k: (lambda s=s: s.run(None, feeds)) for k, s in sessions.items()}
    times = interleaved_ms(runs, warmup=args.warmup, iters=args.rounds)
    base = args.base or first
    print(f"past {args.past}, batch {args.batch}, {args.rounds} rounds; ratios to {base}")
    for label, row in paired_summary(times, base).items():
        print(
            f"  {label}: median {row['median_ms']:.4f} ms, paired ratio "
            f"{row['paired_ratio']:.3f} [{row['p10']:.3f}-{row['p90']:.3f}]"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
