"""Write a synthetic Llama-shaped decoder of a given size, with external data (issue 29).

    python bench/make_big_decoder.py --size-gb 2.5 -o /tmp/big   # decoder.onnx + .data
    python bench/make_big_decoder.py --size-gb 3 --weights fp16 -o /tmp/big16
    python bench/make_big_decoder.py --preset 7b --weights int4 --block-size 128 -o /tmp/7b

No torch and no download: the graph is built with ``onnx.helper`` and the weights are
seeded random numbers streamed to ``decoder.onnx.data`` one initializer at a time
(``bench/_big_models.py`` says what the graph holds), so a model of several GiB takes
seconds and the memory of its largest matrix. ``--size-gb`` is in GiB (2^30 bytes);
hidden size, heads and layers are chosen to reach it (``--hidden`` fixes the hidden
size, ``--layers`` the layers instead; ``--preset 7b`` is Llama-2-7B / Mistral-7B's shape).
``--weights fp16`` writes the whole model in fp16, ``--weights int4`` its projections
as onnxruntime-genai's int4 (``com.microsoft.MatMulNBits``, ``--block-size`` 32 as the
builder's default, or 128; ``bench/_big_weights.py``). Prints what was written, as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _big_models import PRESETS, make_decoder, shape_for_size
from _big_weights import KINDS, Weights

GIB = 1 << 30


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    size = parser.add_mutually_exclusive_group(required=True)
    size.add_argument("--size-gb", type=float, help="weights as stored, in GiB")
    size.add_argument("--preset", choices=sorted(PRESETS), help="a named shape")
    parser.add_argument("-o", "--out", required=True, help="folder for decoder.onnx and .data")
    parser.add_argument("--hidden", type=int, help="hidden size (default: from the size)")
    parser.add_argument("--layers", type=int, help="layers (default: from the size)")
    parser.add_argument("--weights", choices=KINDS, default="fp32")
    parser.add_argument("--block-size", type=int, default=32, help="int4's block (32, 128)")
    parser.add_argument("--accuracy-level", type=int, default=4, help="int4's (builder: 4)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.size_gb is not None and args.size_gb <= 0:
        parser.error("--size-gb must be positive")
    try:
        weights = Weights(args.weights, args.block_size, args.accuracy_level)
        shape = PRESETS.get(args.preset) or shape_for_size(
            args.size_gb * GIB, hidden=args.hidden, weights=weights
        )
    except ValueError as exc:
        parser.error(str(exc))
    if args.layers:
        shape = replace(shape, layers=args.layers)
    start = time.perf_counter()
    info = make_decoder(Path(args.out), shape, seed=args.seed, weights=weights)
    info["seconds"] = round(time.perf_counter() - start, 2)
    print(json.dumps(info, indent=2))


if __name__ == "__main__":
    main()
