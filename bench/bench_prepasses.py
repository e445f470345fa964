"""How long the pre-passes take per model (issue 13: under 1 s below 5k nodes).

Runs ``fusion_core.prepasses.run_prepasses`` on a fresh load of each model ``--repeat``
times and prints the median and range per model, as JSON lines and a Markdown table.
To compare two versions of the code side by side, run the script twice in one session,
once with ``PYTHONPATH`` pointing at a checkout of the other version (``git worktree
add /tmp/old REV``), e.g.::

    python bench/bench_prepasses.py ~/.cache/autofusion-corpus/models/ppocr_det_v4/model.onnx ...
    PYTHONPATH=/tmp/old python bench/bench_prepasses.py ... --label old
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from autofusion.fusion_core.ir import load_model
from autofusion.fusion_core.prepasses import PrepassOptions, run_prepasses


def time_prepasses(path: Path, repeat: int) -> dict:
    seconds = []
    nodes = 0
    for _ in range(repeat):
        model = load_model(path)  # the pre-passes work in place: a fresh copy each time
        nodes = sum(1 for _ in model.graph)
        start = time.perf_counter()
        run_prepasses(model, PrepassOptions())
        seconds.append(time.perf_counter() - start)
    return {
        "model": path.parent.name if path.name == "model.onnx" else path.stem,
        "nodes": nodes,
        "median_s": statistics.median(seconds),
        "min_s": min(seconds),
        "max_s": max(seconds),
        "repeat": repeat,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="+", type=Path)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--label", default="current")
    args = parser.parse_args()
    rows = [time_prepasses(path, args.repeat) | {"label": args.label} for path in args.models]
    for row in rows:
        print(json.dumps(row))
    print(f"\n| model | nodes | pre-passes ({args.label}), median s [min, max] |")
    print("| --- | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['model']} | {row['nodes']} | {row['median_s']:.2f} "
            f"[{row['min_s']:.2f}, {row['max_s']:.2f}] |"
        )


if __name__ == "__main__":
    main()
