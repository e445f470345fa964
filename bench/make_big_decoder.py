"""Write a synthetic Llama-shaped decoder of a given size, with external data (issue 29).

    python bench/make_big_decoder.py --size-gb 2.5 -o /tmp/big   # decoder.onnx + .data

No torch and no download: the graph is built with ``onnx.helper`` and the weights are
seeded random numbers streamed to ``decoder.onnx.data`` one initializer at a time
(``bench/_big_models.py`` says what the graph holds), so a model of several GiB takes
seconds and the memory of its largest matrix. ``--size-gb`` is in GiB (2^30 bytes);
hidden size, heads and layers are chosen to reach it (``--hidden`` fixes the hidden
size, ``--layers`` the layers instead). Prints what was written, as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _big_models import make_decoder, shape_for_size

GIB = 1 << 30


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-gb", type=float, required=True, help="weights, in GiB")
    parser.add_argument("-o", "--out", required=True, help="folder for decoder.onnx and .data")
    parser.add_argument("--hidden", type=int, help="hidden size (default: from the size)")
    parser.add_argument("--layers", type=int, help="layers (default: from the size)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.size_gb <= 0:
        parser.error("--size-gb must be positive")
    try:
        shape = shape_for_size(args.size_gb * GIB, hidden=args.hidden)
    except ValueError as exc:
        parser.error(str(exc))
    if args.layers:
        shape = replace(shape, layers=args.layers)
    start = time.perf_counter()
    info = make_decoder(Path(args.out), shape, seed=args.seed)
    info["seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
