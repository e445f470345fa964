"""onnxruntime's CPU GroupQueryAttention with and without ``softcap``, one node each,
interleaved: what the soft-cap path costs by head size, query length and past.

Why: the default ``cpu`` profile prices a soft-capped attention as a loss (a kernel factor
of 6.0, measured on the corpus's small Gemma-2); the model-builder comparison at heads of
256 found the fused soft-cap a gain at decode (docs/benchmarks.md section 30). This
measures the kernel alone, to see where the factor should depend on the shapes.

    python bench/bench_softcap_kernel.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto
from onnx import helper as oh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _interleaved import interleaved_ms, paired_summary

SHAPES = [(32, 8, 2), (64, 16, 4), (128, 8, 2), (256, 4, 2)]  # head size, heads, KV heads
STEPS = [(1, 128), (1, 1024), (128, 0), (512, 0)]  # new tokens, past


def _value(name: str, shape: list) -> object:
    return oh.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def session(heads: tuple[int, int, int], softcap: bool, past: int) -> ort.InferenceSession:
    size, n, kv = heads
    inputs = ["q", "k", "v", "pk" if past else "", "pv" if past else "", "seqlens", "total"]
    attrs = {"num_heads": n, "kv_num_heads": kv, "scale": 1.0 / np.sqrt(size)}
    if softcap:
        attrs["softcap"] = 50.0
    node = oh.make_node(
        "GroupQueryAttention", inputs, ["y", "pko", "pvo"], domain="com.microsoft", **attrs
    )
    ins = [_value("q", ["B", "S", n * size])]
    ins += [_value(name, ["B", "S", kv * size]) for name in ("k", "v")]
    if past:
        ins += [_value(name, ["B", kv, "P", size]) for name in ("pk", "pv")]
    ins += [oh.make_tensor_value_info("seqlens", TensorProto.INT32, ["B"])]
    ins += [oh.make_tensor_value_info("total", TensorProto.INT32, [])]
    outs = [_value(name, None) for name in ("y", "pko", "pvo")]
    opsets = [oh.make_opsetid("", 18), oh.make_opsetid("com.microsoft", 1)]
    model = oh.make_model(oh.make_graph([node], "g", ins, outs), opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def feeds(heads: tuple[int, int, int], new: int, past: int) -> dict[str, np.ndarray]:
    size, n, kv = heads
    rng = np.random.default_rng(0)
    found = {
        "q": rng.standard_normal((1, new, n * size)),
        "k": rng.standard_normal((1, new, kv * size)),
        "v": rng.standard_normal((1, new, kv * size)),
    }
    if past:
        found |= {name: rng.standard_normal((1, kv, past, size)) for name in ("pk", "pv")}
    found = {k: v.astype(np.float32) for k, v in found.items()}
    found["seqlens"] = np.array([past + new - 1], np.int32)
    found["total"] = np.array(past + new, np.int32)
    return found


def main() -> None:
    print("| head size | heads / kv | new | past | softcap / none [p10-p90] | ms none |")
    print("|---|---|---|---|---|---|")
    for heads in SHAPES:
        for new, past in STEPS:
            sample = feeds(heads, new, past)
            runs = {}
            for label, capped in (("none", False), ("softcap", True)):
                sess = session(heads, capped, past)
                runs[label] = lambda s=sess, f=sample: s.run(None, f)
            iters = 200 if new * (past + new) < 20000 else 40
            summary = paired_summary(interleaved_ms(runs, warmup=10, iters=iters), "none")
            row = summary["softcap"]
            ratio = f"{row['paired_ratio']:.3f} [{row['p10']:.3f}-{row['p90']:.3f}]"
            size, n, kv = heads
            ms = summary["none"]["median_ms"]
            print(f"| {size} | {n} / {kv} | {new} | {past} | {ratio} | {ms:.3f} |", flush=True)


if __name__ == "__main__":
    main()
