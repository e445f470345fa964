"""What the cache's mean for rows with nothing to attend to costs a decode step, and what
guarding it costs instead: N layers of CPU GroupQueryAttention (16 heads of 64, 4 KV
heads; ``--projections``: with hidden-1024 q/k/v/o MatMuls around each), batch 1, one
new token, interleaved, ORT_ENABLE_ALL, 2 threads.

Variants, each layer's attention output:
- ``none``: the kernel's output as it is (the model builder's graph; wrong on an empty row);
- ``mean``: ``Where(keep, gqa, mean)``, the mean read from the present value cache every
  step (the rewriter's graph before the guard);
- ``if``: ``If(any row empty)``, the mean and the Where in the then-branch, the kernel's
  output passed through in the else-branch; the condition computed once per mask;
- ``slice``: the mean of ``present_value[:, :, :n]`` with ``n = L`` when a row is empty
  and 0 when none is (one shared ``n``): the Where's unpicked side reads no cache.

Why: the model builder's graph has no mean, and a decode step's query (a real token)
never has an empty row (docs/benchmarks.md section 31).

    flock /tmp/bench.lock python bench/bench_empty_rows_guard.py [--iters 300] [--projections]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, numpy_helper
from onnx import helper as oh

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _interleaved import interleaved_ms, paired_summary

HIDDEN, HEADS, KV_HEADS, SIZE = 1024, 16, 4, 64
VARIANTS = ("none", "mean", "if", "slice")
OPSETS = [oh.make_opsetid("", 18), oh.make_opsetid("com.microsoft", 1)]


def _const(name: str, array: np.ndarray) -> TensorProto:
    return numpy_helper.from_array(array, name)


def _mean_nodes(layer: int, present: str, out: str) -> list:
    """``out`` [B, 1, N * H]: each query head's mean of its KV head's values."""
    p = f"l{layer}_"
    return [
        oh.make_node("ReduceMean", [present, "axis2"], [p + "m"], keepdims=1),
        oh.make_node("Unsqueeze", [p + "m", "axis2"], [p + "u"]),
        oh.make_node("Expand", [p + "u", "repeat"], [p + "e"]),
        oh.make_node("Reshape", [p + "e", "merged"], [out]),
    ]


def _guard_branches(layer: int, gqa: str, present: str) -> tuple:
    """The If's two branches: the mean and the Where, or the kernel's output."""
    p = f"l{layer}_"
    out = oh.make_tensor_value_info(p + "then", TensorProto.FLOAT, None)
    then_nodes = _mean_nodes(layer, present, p + "mean")
    then_nodes.append(oh.make_node("Where", ["keep", gqa, p + "mean"], [p + "then"]))
    then = oh.make_graph(then_nodes, p + "then_g", [], [out])
    other_out = oh.make_tensor_value_info(p + "else", TensorProto.FLOAT, None)
    other = oh.make_graph(
        [oh.make_node("Identity", [gqa], [p + "else"])], p + "else_g", [], [other_out]
    )
    return then, other


def _layer(layer: int, x: str, variant: str, inits: list, projections: bool) -> tuple[list, str]:
    """One layer's nodes, x -> x + o(attention(x)); the name of its output."""
    p = f"l{layer}_"
    rng = np.random.default_rng(layer)
    nodes = []
    if projections:
        widths = (("q", HEADS * SIZE), ("k", KV_HEADS * SIZE), ("v", KV_HEADS * SIZE))
        for name, width in widths:
            weight = (rng.standard_normal((HIDDEN, width)) / np.sqrt(HIDDEN)).astype(np.float32)
            inits.append(_const(p + "w" + name, weight))
            nodes.append(oh.make_node("MatMul", [x, p + "w" + name], [p + name]))
        gqa_in = [p + "q", p + "k", p + "v"]
    else:  # the attention alone: the layer's query is the last output, k and v are fed
        gqa_in = [x, f"k_{layer}", f"v_{layer}"]
    gqa_in += [f"past_key_{layer}", f"past_value_{layer}"]
    gqa_in += ["seqlens", "total", "", "", "", "bias"]
    present = f"present_value_{layer}"
    nodes.append(
        oh.make_node(
            "GroupQueryAttention",
            gqa_in,
            [p + "gqa", f"present_key_{layer}", present],
            domain="com.microsoft",
            num_heads=HEADS,
            kv_num_heads=KV_HEADS,
            scale=float(1 / np.sqrt(SIZE)),
            causal=1,
        )
    )
    attended = p + "gqa"
    if variant == "mean":
        nodes += _mean_nodes(layer, present, p + "mean")
        nodes.append(oh.make_node("Where", ["keep", p + "gqa", p + "mean"], [p + "att"]))
        attended = p + "att"
    elif variant == "if":
        then, other = _guard_branches(layer, p + "gqa", present)
        nodes.append(
            oh.make_node("If", ["any_empty"], [p + "att"], then_branch=then, else_branch=other)
        )
        attended = p + "att"
    elif variant == "slice":
        nodes.append(oh.make_node("Slice", [present, "zero", "rows", "axis2"], [p + "sliced"]))
        nodes += _mean_nodes(layer, p + "sliced", p + "mean")
        nodes.append(oh.make_node("Where", ["keep", p + "gqa", p + "mean"], [p + "att"]))
        attended = p + "att"
    if not projections:
        return nodes, attended
    weight = (rng.standard_normal((HEADS * SIZE, HIDDEN)) / np.sqrt(HIDDEN)).astype(np.float32)
    inits.append(_const(p + "wo", weight))
    nodes.append(oh.make_node("MatMul", [attended, p + "wo"], [p + "o"]))
    nodes.append(oh.make_node("Add", [x, p + "o"], [p + "x"]))
    return nodes, p + "x"


def _mask_nodes() -> list:
    """The bias, the rows to keep ([B, S, 1] bool) and the guards, once per model."""
    return [
        oh.make_node("Where", ["allowed", "zero_f", "lowest"], ["bias"]),
        oh.make_node("Cast", ["allowed"], ["allowed_f"], to=TensorProto.FLOAT),
        oh.make_node("ReduceMax", ["allowed_f", "axis3"], ["rows_f"], keepdims=0),
        oh.make_node("Transpose", ["rows_f"], ["keep_f"], perm=[0, 2, 1]),
        oh.make_node("Cast", ["keep_f"], ["keep"], to=TensorProto.BOOL),
        oh.make_node("ReduceMin", ["keep_f"], ["all_kept"], keepdims=0),
        oh.make_node("Less", ["all_kept", "one_f"], ["any_empty"]),
        # slice: n = L where a row is empty, 0 where none is
        oh.make_node("Shape", ["allowed"], ["allowed_shape"], start=3, end=4),
        oh.make_node("Cast", ["any_empty"], ["any_i"], to=TensorProto.INT64),
        oh.make_node("Mul", ["allowed_shape", "any_i"], ["rows"]),
    ]


def model(layers: int, variant: str, projections: bool = False) -> bytes:
    inits = [
        _const("axis2", np.array([2], np.int64)),
        _const("axis3", np.array([3], np.int64)),
        _const("zero", np.array([0], np.int64)),
        _const("repeat", np.array([1, 1, HEADS // KV_HEADS, 1, 1], np.int64)),
        _const("merged", np.array([0, 1, -1], np.int64)),
        _const("zero_f", np.array(0, np.float32)),
        _const("one_f", np.array(1, np.float32)),
        _const("lowest", np.array(np.finfo(np.float32).min, np.float32)),
    ]
    nodes, x = _mask_nodes(), "x"
    ins = [oh.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", HIDDEN])]
    ins.append(oh.make_tensor_value_info("allowed", TensorProto.BOOL, ["B", 1, "S", "L"]))
    ins.append(oh.make_tensor_value_info("seqlens", TensorProto.INT32, ["B"]))
    ins.append(oh.make_tensor_value_info("total", TensorProto.INT32, []))
    outs = []
    for layer in range(layers):
        if not projections:
            for name in ("k", "v"):
                shape = ["B", "S", KV_HEADS * SIZE]
                ins.append(oh.make_tensor_value_info(f"{name}_{layer}", TensorProto.FLOAT, shape))
        for side in ("key", "value"):
            ins.append(
                oh.make_tensor_value_info(
                    f"past_{side}_{layer}", TensorProto.FLOAT, ["B", KV_HEADS, "P", SIZE]
                )
            )
            outs.append(
                oh.make_tensor_value_info(f"present_{side}_{layer}", TensorProto.FLOAT, None)
            )
        more, x = _layer(layer, x, variant, inits, projections)
        nodes += more
    outs.insert(0, oh.make_tensor_value_info(x, TensorProto.FLOAT, None))
    graph = oh.make_graph(nodes, "decoder", ins, outs, initializer=inits)
    return oh.make_model(graph, opset_imports=OPSETS).SerializeToString()


def feeds(
    layers: int, past: int, new: int = 1, empty_row: bool = False, projections: bool = False
) -> dict:
    rng = np.random.default_rng(0)
    total = past + new
    allowed = np.ones((1, 1, new, total), bool)
    if empty_row:
        allowed[0, 0, 0] = False
    found = {
        "x": rng.standard_normal((1, new, HIDDEN)).astype(np.float32),
        "allowed": allowed,
        "seqlens": np.array([total - 1], np.int32),
        "total": np.array(total, np.int32),
    }
    for layer in range(layers):
        if not projections:
            for name in ("k", "v"):
                shape = (1, new, KV_HEADS * SIZE)
                found[f"{name}_{layer}"] = rng.standard_normal(shape).astype(np.float32)
        for side in ("key", "value"):
            found[f"past_{side}_{layer}"] = rng.standard_normal((1, KV_HEADS, past, SIZE)).astype(
                np.float32
            )
    return found


def session(data: bytes) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def agree(layers: int, past: int) -> dict[str, float]:
    """Max abs difference of each guarded variant from ``mean``, with and without an
    empty row (rtol 0: the same nodes compute the same numbers)."""
    sessions = {v: session(model(layers, v)) for v in VARIANTS}
    out = {}
    for empty in (False, True):
        sample = feeds(layers, past, 2, empty_row=empty)
        want = sessions["mean"].run(None, sample)[0]
        for v in ("if", "slice", "none"):
            out[f"{v}{'_empty' if empty else ''}"] = float(
                np.abs(sessions[v].run(None, sample)[0] - want).max()
            )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iters", type=int, default=300)
    parser.add_argument("--projections", action="store_true")
    args = parser.parse_args()
    print("agreement with mean (max abs):", agree(2, 16))
    print("| layers | past | variant | ms | ratio to none [p10-p90] | minus none, ms |")
    print("|---|---|---|---|---|---|")
    for layers in (1, 8):
        for past in (128, 1024):
            sample = feeds(layers, past, projections=args.projections)
            runs = {}
            for variant in VARIANTS:
                sess = session(model(layers, variant, args.projections))
                runs[variant] = lambda s=sess, f=sample: s.run(None, f)
            summary = paired_summary(interleaved_ms(runs, warmup=20, iters=args.iters), "none")
            base = summary["none"]["median_ms"]
            for variant in VARIANTS:
                row = summary[variant]
                ratio = f"{row['paired_ratio']:.3f} [{row['p10']:.3f}-{row['p90']:.3f}]"
                delta = row["median_ms"] - base
                print(
                    f"| {layers} | {past} | {variant} | {row['median_ms']:.3f} | {ratio} "
                    f"| {delta:+.3f} |",
                    flush=True,
                )


if __name__ == "__main__":
    main()
