"""SiLU, HardSwish and HardSigmoid: which spelling runs fastest in onnxruntime (CPU)?

For each activation, alone and after a 3x3 Conv, every candidate spelling is built as
a tiny model (the same seeded weights and input for all of a case's variants):

* SiLU ``x * Sigmoid(x)``: as written (Sigmoid + Mul), ``com.microsoft.QuickGelu``
  with ``alpha = 1`` (``x * sigmoid(alpha * x)``), and ONNX ``Swish`` (opset 24);
* HardSwish: written out as ``x * Clip(x + 3, 0, 6) / 6`` (Add/Clip/Mul/Div, opset 11),
  ``x * HardSigmoid(x)`` (alpha 1/6, beta 0.5; opset 11) and ONNX ``HardSwish``
  (opset 14);
* HardSigmoid: ``Clip(x + 3, 0, 6) / 6`` (Add/Clip/Div), ``HardSigmoid``, and after
  the Conv also ``com.microsoft.FusedConv`` with ``activation = HardSigmoid``.

Latency: at ORT_DISABLE_ALL and at ORT_ENABLE_ALL one session per variant (``--threads``
intra-op threads, one inter-op thread, spinning off), ``--warmup`` then ``--iters``
runs, interleaved: every iteration runs each variant of the case once, the one that
goes first rotating. Per variant: the median, and the median of the paired ratios to
the first variant (the spelling exporters write) with their 10th-90th percentile.
The variants' outputs are compared with the first's (max abs diff, at DISABLE_ALL).

    .venv/bin/python bench/bench_activations.py [--iters 200] [--warmup 20]
        [--threads 1] [--shape 1,32,112,112] [--json results.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnx.parser
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _interleaved import interleaved_ms, paired_summary

LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_ALL")
SIXTH = 1.0 / 6.0

# Each body maps `x` (the activation's input) to `y`.
SILU = {
    "Sigmoid+Mul": (11, "s = Sigmoid (x)\n y = Mul (x, s)"),
    "QuickGelu": (11, "y = com.microsoft.QuickGelu <alpha: float = 1.0> (x)"),
    "Swish (opset 24)": (24, "y = Swish (x)"),
}
HARDSWISH = {
    "Add/Clip/Mul/Div": (
        11,
        "a = Add (x, three)\n c = Clip (a, zero, six)\n m = Mul (x, c)\n y = Div (m, six)",
    ),
    "HardSigmoid+Mul": (11, f"h = HardSigmoid <alpha: float = {SIXTH!r}> (x)\n y = Mul (x, h)"),
    "HardSwish (opset 14)": (14, "y = HardSwish (x)"),
}
HARDSIGMOID = {
    "Add/Clip/Div": (11, "a = Add (x, three)\n c = Clip (a, zero, six)\n y = Div (c, six)"),
    "HardSigmoid": (11, f"y = HardSigmoid <alpha: float = {SIXTH!r}> (x)"),
}
FUSED_CONV_HARDSIGMOID = (
    11,
    'y = com.microsoft.FusedConv <pads = [1, 1, 1, 1], activation = "HardSigmoid", '
    f"activation_params: floats = [{SIXTH!r}, 0.5]> (inp, w, b)",
)


def build(body: str, opset: int, shape: list[int], conv: bool, seed: int) -> onnx.ModelProto:
    """``inp -> [Conv 3x3 ->] body -> y``; weights seeded, constants as initializers."""
    channels = shape[1]
    head = "x = Conv <pads = [1, 1, 1, 1]> (inp, w, b)" if conv else "x = Identity (inp)"
    if body.startswith("y = com.microsoft.FusedConv"):
        head = ""
    text = f"""<ir_version: 10, opset_import: ["" : {opset}, "com.microsoft" : 1]>
    g (float{shape} inp) => (float{shape} y) {{
    {head}
    {body}
    }}"""
    model = onnx.parser.parse_model(text)
    rng = np.random.default_rng(seed)
    inits = {k: v for k, v in (("three", 3.0), ("zero", 0.0), ("six", 6.0)) if k in body}
    if conv or not head:
        inits["w"] = rng.standard_normal((channels, channels, 3, 3)) / np.sqrt(9 * channels)
        inits["b"] = rng.standard_normal(channels) * 0.5
    for name, value in inits.items():
        array = np.asarray(value, dtype=np.float32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(array, name))
    return model


def session(model: onnx.ModelProto, level: str, threads: int) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])


def measure(models: dict[str, onnx.ModelProto], feeds: dict, level: str, args) -> dict:
    sessions = {label: session(m, level, args.threads) for label, m in models.items()}
    runs = {label: functools.partial(sess.run, None, feeds) for label, sess in sessions.items()}
    times = interleaved_ms(runs, warmup=args.warmup, iters=args.iters)
    summary = paired_summary(times, base=next(iter(times)))
    for record in summary.values():  # this script's key names
        record["paired_p10"], record["paired_p90"] = record.pop("p10"), record.pop("p90")
    return summary


def max_diffs(models: dict[str, onnx.ModelProto], feeds: dict, threads: int) -> dict:
    outputs = {
        label: session(m, "ORT_DISABLE_ALL", threads).run(None, feeds)[0]
        for label, m in models.items()
    }
    first = next(iter(outputs.values()))
    return {label: float(np.abs(out - first).max()) for label, out in outputs.items()}


def cases(shape: list[int]) -> dict[str, dict[str, tuple[int, str]]]:
    result = {}
    for name, variants in (("SiLU", SILU), ("HardSwish", HARDSWISH), ("HardSigmoid", HARDSIGMOID)):
        result[name] = dict(variants)
        conv = {f"Conv + {label}": spec for label, spec in variants.items()}
        if name == "HardSigmoid":
            conv["FusedConv(HardSigmoid)"] = FUSED_CONV_HARDSIGMOID
        result[f"Conv + {name}"] = conv
    return result


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--shape", default="1,32,112,112")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    ort.set_default_logger_severity(3)
    shape = [int(d) for d in args.shape.split(",")]
    feeds = {"inp": np.random.default_rng(args.seed).normal(0, 3, shape).astype(np.float32)}
    results: dict = {"args": vars(args), "onnxruntime": ort.__version__, "cases": {}}
    print(
        f"onnxruntime {ort.__version__}, input {shape}, {args.threads} thread(s), "
        f"{args.iters} interleaved runs per variant after {args.warmup} warm-up runs\n"
    )
    print(
        "| case | variant | max abs diff | ms @DISABLE_ALL | paired ratio (p10-p90) "
        "| ms @ENABLE_ALL | paired ratio (p10-p90) |"
    )
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for case, variants in cases(shape).items():
        conv = case.startswith("Conv")
        models = {
            label: build(body, opset, shape, conv, args.seed)
            for label, (opset, body) in variants.items()
        }
        record = {"max_abs_diff": max_diffs(models, feeds, args.threads)}
        for level in LEVELS:
            record[level] = measure(models, feeds, level, args)
        results["cases"][case] = record
        for label in models:
            cells = [f"{record['max_abs_diff'][label]:.1e}"]
            for level in LEVELS:
                r = record[level][label]
                cells += [
                    f"{r['median_ms']:.3f}",
                    f"{r['paired_ratio']:.3f} ({r['paired_p10']:.2f}-{r['paired_p90']:.2f})",
                ]
            print(f"| {case} | {label} | " + " | ".join(cells) + " |", flush=True)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    sys.exit(main())
