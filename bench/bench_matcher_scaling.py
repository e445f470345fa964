"""How the matcher (and the whole pipeline) scale with graph size.

Builds synthetic graphs of about 1k, 10k and 100k nodes out of one repeated
10-node unit with tiny constant weights (4 channels, 4x4 images), so the cost
measured is the graph walk, not the arithmetic:

    main chain  h -> Conv -> BatchNormalization -> Relu -> a
                a -> Pad -> Conv -> BatchNormalization -> Add(h) -> Relu -> next h
    2-D chain   y -> MatMul(W) -> Add(b) -> next y

Every unit offers conv_bn, conv_bn_relu, conv_activation, conv_bn_add_relu,
pad_conv and matmul_add candidates (several overlapping), like a ResNet does.

Then it times ``Matcher(<all built-in specs>).find(graph)`` (median of
``--repeat`` runs) and, unless ``--no-optimize``, the whole ``optimize`` with
the check disabled, and prints Markdown tables. Matching should grow linearly:
the ``us/node`` column should stay flat and ``ratio`` track the node count.

    python bench/bench_matcher_scaling.py [--sizes 1000 10000 100000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnx_ir as ir
from onnx import TensorProto, helper, numpy_helper

from autofusion.fusion_core import OptimizeConfig, builtin_patterns, optimize
from autofusion.fusion_core.patterns import Matcher

CHANNELS = 4
SIDE = 4
FEATURES = 4
NODES_PER_UNIT = 10
OPSET = 17


def _tensor(rng: np.random.Generator, name: str, shape: tuple[int, ...]) -> TensorProto:
    return numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32) * 0.1, name)


def _bn_params(rng: np.random.Generator, prefix: str) -> list[TensorProto]:
    c = CHANNELS
    return [
        numpy_helper.from_array(rng.uniform(0.5, 1.5, c).astype(np.float32), f"{prefix}.scale"),
        numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), f"{prefix}.bias"),
        numpy_helper.from_array(rng.normal(0, 0.1, c).astype(np.float32), f"{prefix}.mean"),
        numpy_helper.from_array(rng.uniform(0.5, 2, c).astype(np.float32), f"{prefix}.var"),
    ]


def _value_infos(p: str) -> list[onnx.ValueInfoProto]:
    """Types and shapes of unit ``p``'s intermediate values, as shape inference gives them.

    Written out directly, so that the matcher sees typed values (dtype and shape
    constraints can hold) without paying for shape inference on a 100k-node graph.
    """
    image = [1, CHANNELS, SIDE, SIDE]
    shapes = {f"{p}.{k}": image for k in ("c1", "b1", "a", "c2", "b2", "sum", "h")}
    shapes[f"{p}.pad"] = [1, CHANNELS, SIDE + 2, SIDE + 2]
    shapes[f"{p}.mm"] = shapes[f"{p}.y"] = [2, FEATURES]
    return [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()]


def _unit(
    i: int, h: str, y: str, rng: np.random.Generator
) -> tuple[list[onnx.NodeProto], list[TensorProto], str, str]:
    """The 10 nodes of unit ``i``: main chain from ``h``, 2-D chain from ``y``."""
    p = f"u{i}"
    c = CHANNELS
    inits = [
        _tensor(rng, f"{p}.w1", (c, c, 1, 1)),
        *_bn_params(rng, f"{p}.bn1"),
        _tensor(rng, f"{p}.w2", (c, c, 3, 3)),
        *_bn_params(rng, f"{p}.bn2"),
        _tensor(rng, f"{p}.mm_w", (FEATURES, FEATURES)),
        _tensor(rng, f"{p}.mm_b", (FEATURES,)),
    ]
    bn = ["scale", "bias", "mean", "var"]
    nodes = [
        helper.make_node("Conv", [h, f"{p}.w1"], [f"{p}.c1"], name=f"{p}/conv1"),
        helper.make_node(
            "BatchNormalization",
            [f"{p}.c1", *(f"{p}.bn1.{k}" for k in bn)],
            [f"{p}.b1"],
            name=f"{p}/bn1",
        ),
        helper.make_node("Relu", [f"{p}.b1"], [f"{p}.a"], name=f"{p}/relu1"),
        helper.make_node("Pad", [f"{p}.a", "pads"], [f"{p}.pad"], name=f"{p}/pad", mode="constant"),
        helper.make_node("Conv", [f"{p}.pad", f"{p}.w2"], [f"{p}.c2"], name=f"{p}/conv2"),
        helper.make_node(
            "BatchNormalization",
            [f"{p}.c2", *(f"{p}.bn2.{k}" for k in bn)],
            [f"{p}.b2"],
            name=f"{p}/bn2",
        ),
        helper.make_node("Add", [f"{p}.b2", h], [f"{p}.sum"], name=f"{p}/add"),
        helper.make_node("Relu", [f"{p}.sum"], [f"{p}.h"], name=f"{p}/relu2"),
        helper.make_node("MatMul", [y, f"{p}.mm_w"], [f"{p}.mm"], name=f"{p}/matmul"),
        helper.make_node("Add", [f"{p}.mm", f"{p}.mm_b"], [f"{p}.y"], name=f"{p}/bias"),
    ]
    return nodes, inits, f"{p}.h", f"{p}.y"


def build_model(n_nodes: int, seed: int = 0) -> onnx.ModelProto:
    """A valid model of ``n_nodes`` nodes (rounded down to whole 10-node units)."""
    rng = np.random.default_rng(seed)
    pads = numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")
    nodes: list[onnx.NodeProto] = []
    inits: list[TensorProto] = [pads]
    infos: list[onnx.ValueInfoProto] = []
    h, y = "x", "y"
    for i in range(max(1, n_nodes // NODES_PER_UNIT)):
        unit_nodes, unit_inits, next_h, next_y = _unit(i, h, y, rng)
        nodes += unit_nodes
        inits += unit_inits
        infos += _value_infos(f"u{i}")
        h, y = next_h, next_y
    graph = helper.make_graph(
        nodes,
        "scaling",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, CHANNELS, SIDE, SIDE]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, FEATURES]),
        ],
        [
            helper.make_tensor_value_info(h, TensorProto.FLOAT, [1, CHANNELS, SIDE, SIDE]),
            helper.make_tensor_value_info(y, TensorProto.FLOAT, [2, FEATURES]),
        ],
        initializer=inits,
        value_info=[v for v in infos if v.name not in (h, y)],  # outputs have theirs
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])


def median_seconds(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    """Median wall time of ``repeat`` calls (GC collected before, not during, each)."""
    times = []
    value = None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), value


def measure_matcher(sizes: list[int], repeat: int) -> list[dict]:
    specs = [p.spec for p in builtin_patterns()]
    rows = []
    for size in sizes:
        graph = ir.serde.deserialize_model(build_model(size)).graph
        matcher = Matcher(specs)
        seconds, found = median_seconds(lambda g=graph, m=matcher: m.find(g), repeat)
        rows.append(
            {
                "nodes": len(graph),
                "candidates": len(found.candidates),
                "near_misses": len(found.near_misses),
                "seconds": seconds,
            }
        )
    return rows


def measure_optimize(
    sizes: list[int], repeat: int, target: str, single_run_above: float
) -> list[dict]:
    """Median of ``repeat`` optimize runs per size; one run only where that one run
    already took over ``single_run_above`` seconds (the 100k graph)."""
    config = OptimizeConfig(target=target, check={"enabled": False})
    rows = []
    for size in sizes:
        model = build_model(size)
        runs = []
        while len(runs) < repeat:
            gc.collect()
            start = time.perf_counter()
            result = optimize(model, config)
            runs.append((time.perf_counter() - start, result.timings))
            if runs[0][0] > single_run_above:
                break
        phases = {k: statistics.median(t[k] for _, t in runs) for k in runs[0][1]}
        rows.append(
            {
                "nodes": len(model.graph.node),
                "nodes_after": sum(result.ops_after.values()),
                "fusions": sum(result.counts.values()),
                "rounds": result.rounds,
                "seconds": statistics.median(s for s, _ in runs),
                "phases": phases,
                "repeat": len(runs),
            }
        )
    return rows


def matcher_table(rows: list[dict]) -> str:
    base = rows[0]["seconds"] / rows[0]["nodes"]
    lines = [
        "| nodes | candidates | near misses | median s | us/node | ratio vs first (per node) |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    first = rows[0]["seconds"]
    for r in rows:
        per_node = r["seconds"] / r["nodes"]
        lines.append(
            f"| {r['nodes']:,} | {r['candidates']:,} | {r['near_misses']:,} "
            f"| {r['seconds']:.4f} | {per_node * 1e6:.1f} "
            f"| {r['seconds'] / first:.1f}x ({per_node / base:.2f}) |"
        )
    return "\n".join(lines)


def optimize_table(rows: list[dict], target: str) -> str:
    phases = list(rows[0]["phases"])
    head = " | ".join(phases)
    lines = [
        f"| nodes | runs | fusions | rounds | nodes after | {head} | total s | us/node |",
        "|" + " ---: |" * (len(phases) + 7),
    ]
    for r in rows:
        cells = " | ".join(f"{r['phases'][p]:.3f}" for p in phases)
        lines.append(
            f"| {r['nodes']:,} | {r['repeat']} | {r['fusions']:,} | {r['rounds']} "
            f"| {r['nodes_after']:,} | {cells} | {r['seconds']:.3f} "
            f"| {r['seconds'] / r['nodes'] * 1e6:.0f} |"
        )
    return f"optimize, target {target}, check disabled (median seconds per phase)\n\n" + "\n".join(
        lines
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=5, help="runs per size (median)")
    parser.add_argument(
        "--optimize-sizes",
        type=int,
        nargs="*",
        help="sizes for the optimize timing (default: same as --sizes)",
    )
    parser.add_argument("--optimize-repeat", type=int, default=3)
    parser.add_argument(
        "--single-run-above",
        type=float,
        default=30.0,
        help="do not repeat an optimize run that took longer than this (seconds)",
    )
    parser.add_argument("--target", default="onnxruntime", choices=["generic", "onnxruntime"])
    parser.add_argument("--no-optimize", action="store_true", help="time the matcher only")
    args = parser.parse_args(argv)

    print("Matcher(all built-in specs).find(graph)\n")
    print(matcher_table(measure_matcher(args.sizes, args.repeat)))
    if not args.no_optimize:
        sizes = args.optimize_sizes if args.optimize_sizes is not None else args.sizes
        rows = measure_optimize(sizes, args.optimize_repeat, args.target, args.single_run_above)
        print()
        print(optimize_table(rows, args.target))


if __name__ == "__main__":
    main()
