"""Prefill and decode latency of LLM decoder variants with a KV cache, paired and interleaved.

Why: issue 17 measures decoders the way they are served: a prefill of a prompt (batch 1,
``--prefill`` tokens, empty past) and a decode step (1 new token after ``--past``
cached ones), at ``ORT_ENABLE_ALL`` with 2 intra-op threads, each variant against the
first (the original export), interleaved so that the machine's drift falls on all
alike (``bench/_interleaved.py``). A decode step reads every weight once, so memory
bandwidth bounds it: the table gives the achieved GB/s, the bytes of the original's
float initializers that a step reads (all but the token embedding table, which a Gather
reads one row of) over the median time.

Variants are ``label=path`` pairs of graphs with the same inputs (optimum's or
``export_llm``'s names: ``input_ids``, ``attention_mask``, optional ``position_ids``,
``past_key_values.<i>.key|value``); the first is the base of the ratios.

    python bench/corpus/bench_llm.py original=model.onnx fused=out.onnx \\
        [--past 128] [--prefill 128] [--threads 2] [--iters 200] [--warmup 20] [--json F]

``--skip-norm-kernel`` instead times onnxruntime's SkipSimplifiedLayerNormalization
against the Add + SimplifiedLayerNormalization it replaces on ``[1, S, 512]`` fp32 for
S = 1, 16, 128, 512 (the measurement behind ``skip_rms_norm``'s kernel factor in
``fusion_core/target_profiles/cpu.yaml``). ``--merge-kernel`` times the sibling
projections of a decoder layer (Q/K/V: 512 -> 512, 128, 128; gate/up: 512 -> 1376, 1376)
as separate MatMuls against one MatMul over the concatenated weights and a Split, on
``[1, S, 512]`` for the same S (the measurement behind ``merge_siblings``' pricing).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _interleaved import interleaved_ms, paired_summary

from autofusion.fusion_core.profiling import session_options


def streamed_bytes(path: Path) -> int:
    """Bytes of float initializers a decode step reads: all but Gather-only tables."""
    model = onnx.load(str(path), load_external_data=True)
    readers: dict[str, set[str]] = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, set()).add(node.op_type)
    total = 0
    for init in model.graph.initializer:
        width = {onnx.TensorProto.FLOAT: 4, onnx.TensorProto.FLOAT16: 2}.get(init.data_type)
        if width is None or readers.get(init.name) == {"Gather"}:
            continue
        total += width * int(np.prod(init.dims))
    return total


def with_head_size(model: Path, head: int) -> Path:
    """The model builder's graph (``model``) with its cache's last dim
    (``kv_cache_dim``) set to ``head``, so the shared feeds read it from the inputs;
    written beside it (``model_bench.onnx``), the graph only: its data file, if any,
    read where it lies (a 2 GB builder model cannot be held as one proto)."""
    proto = onnx.load(str(model), load_external_data=False)
    for value in proto.graph.input:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param == "kv_cache_dim":
                dim.Clear()
                dim.dim_value = head
    out = model.with_name("model_bench.onnx")
    onnx.save(proto, str(out))
    return out


def feeds(sess: ort.InferenceSession, *, past: int, new: int, seed: int = 0) -> dict:
    """Random feeds for one step: ``new`` tokens after ``past`` cached ones, batch 1."""
    rng = np.random.default_rng(seed)
    out = {}
    for arg in sess.get_inputs():
        name = arg.name
        if name == "input_ids":
            out[name] = rng.integers(3, 200, (1, new), dtype=np.int64)
        elif name == "attention_mask":
            out[name] = np.ones((1, past + new), np.int64)
        elif name == "position_ids":
            out[name] = np.arange(past, past + new, dtype=np.int64)[None]
        elif name.startswith("past_key_values."):
            heads, dim = arg.shape[1], arg.shape[3]
            dtype = np.float16 if arg.type == "tensor(float16)" else np.float32
            out[name] = rng.standard_normal((1, heads, past, dim)).astype(dtype)
        else:
            raise SystemExit(f"bench_llm: input {name!r} is not a decoder input it knows")
    return out


def measure(paths: dict[str, Path], args) -> dict:
    sessions = {
        label: ort.InferenceSession(
            str(path), session_options("ORT_ENABLE_ALL", args.threads), ["CPUExecutionProvider"]
        )
        for label, path in paths.items()
    }
    base = next(iter(paths))
    results = {"streamed_bytes": streamed_bytes(paths[base])}
    for phase, past, new in (("prefill", 0, args.prefill), ("decode", args.past, 1)):
        step = {label: feeds(s, past=past, new=new) for label, s in sessions.items()}
        runs = {label: (lambda s=s, f=step[label]: s.run(None, f)) for label, s in sessions.items()}
        times = interleaved_ms(runs, warmup=args.warmup, iters=args.iters)
        results[phase] = paired_summary(times, base)
    return results


def markdown(results: dict, args) -> str:
    gb = results["streamed_bytes"] / 1e9
    lines = [
        f"prefill {args.prefill} tokens, decode 1 token after {args.past}; ORT_ENABLE_ALL, "
        f"{args.threads} threads, {args.iters} interleaved rounds; a decode step reads "
        f"{results['streamed_bytes'] / 2**20:.1f} MiB of weights",
        "",
        "| variant | prefill ms | paired ratio [p10-p90] | decode ms | paired ratio [p10-p90] "
        "| decode GB/s |",
        "|---|---|---|---|---|---|",
    ]
    for label, pre in results["prefill"].items():
        dec = results["decode"][label]
        lines.append(
            f"| {label} | {pre['median_ms']:.2f} | {pre['paired_ratio']:.3f} "
            f"[{pre['p10']:.3f}-{pre['p90']:.3f}] | {dec['median_ms']:.2f} | "
            f"{dec['paired_ratio']:.3f} [{dec['p10']:.3f}-{dec['p90']:.3f}] | "
            f"{gb / (dec['median_ms'] / 1000):.1f} |"
        )
    return "\n".join(lines)


def _skip_norm_model(fused: bool, rows: int, hidden: int) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    gamma = np.random.default_rng(0).uniform(0.5, 1.5, hidden).astype(np.float32)
    if fused:
        nodes = [
            helper.make_node(
                "SkipSimplifiedLayerNormalization", ["x", "r", "g"], ["y", "", "", "s"],
                domain="com.microsoft", epsilon=1e-5,
            )
        ]  # fmt: skip
    else:
        nodes = [
            helper.make_node("Add", ["x", "r"], ["s"]),
            helper.make_node("SimplifiedLayerNormalization", ["s", "g"], ["y"], epsilon=1e-5),
        ]
    shape = [1, rows, hidden]
    graph = helper.make_graph(
        nodes,
        "skip_norm",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "xr"],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "ys"],
        [onnx.numpy_helper.from_array(gamma, "g")],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def skip_norm_kernel(args, hidden: int = 512) -> str:
    """Median microseconds of the fused kernel and of the pair, interleaved."""
    lines = ["| rows | Add + SimplifiedLayerNormalization us | SkipSimplified us | ratio |"]
    lines.append("|---|---|---|---|")
    for rows in (1, 16, 128, 512):
        rng = np.random.default_rng(rows)
        feed = {n: rng.standard_normal((1, rows, hidden)).astype(np.float32) for n in "xr"}
        runs = {}
        for label, fused in (("pair", False), ("fused", True)):
            model = _skip_norm_model(fused, rows, hidden).SerializeToString()
            opts = session_options("ORT_ENABLE_ALL", args.threads)
            sess = ort.InferenceSession(model, opts, ["CPUExecutionProvider"])
            runs[label] = lambda s=sess, f=feed: s.run(None, f)
        summary = paired_summary(
            interleaved_ms(runs, warmup=args.warmup, iters=args.iters * 10), "pair"
        )
        pair, fused = summary["pair"], summary["fused"]
        lines.append(
            f"| {rows} | {pair['median_ms'] * 1000:.1f} | {fused['median_ms'] * 1000:.1f} | "
            f"{fused['paired_ratio']:.2f} [{fused['p10']:.2f}-{fused['p90']:.2f}] |"
        )
    return "\n".join(lines)


def _projection_model(merged: bool, rows: int, hidden: int, widths) -> onnx.ModelProto:
    from onnx import TensorProto, helper

    rng = np.random.default_rng(len(widths))
    weights = [rng.standard_normal((hidden, w)).astype(np.float32) / hidden**0.5 for w in widths]
    outs = [f"y{i}" for i in range(len(widths))]
    if merged:
        inits = [
            onnx.numpy_helper.from_array(np.concatenate(weights, axis=1), "w"),
            onnx.numpy_helper.from_array(np.array(widths, np.int64), "split"),
        ]
        nodes = [
            helper.make_node("MatMul", ["x", "w"], ["merged"]),
            helper.make_node("Split", ["merged", "split"], outs, axis=-1),
        ]
    else:
        inits = [onnx.numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)]
        nodes = [helper.make_node("MatMul", ["x", f"w{i}"], [o]) for i, o in enumerate(outs)]
    graph = helper.make_graph(
        nodes,
        "projections",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows, hidden])],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, [1, rows, w])
         for o, w in zip(outs, widths, strict=True)],
        inits,
    )  # fmt: skip
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def merge_kernel(args, hidden: int = 512) -> str:
    """Median microseconds of separate projections and of the merged MatMul + Split."""
    lines = ["| projections | rows | separate MatMuls us | merged + Split us | ratio |"]
    lines.append("|---|---|---|---|---|")
    for name, widths in (("Q/K/V", (512, 128, 128)), ("gate/up", (1376, 1376))):
        for rows in (1, 16, 128, 512):
            feed = {"x": np.random.default_rng(rows).standard_normal((1, rows, hidden))}
            feed["x"] = feed["x"].astype(np.float32)
            runs = {}
            for label, merged in (("separate", False), ("merged", True)):
                model = _projection_model(merged, rows, hidden, widths).SerializeToString()
                opts = session_options("ORT_ENABLE_ALL", args.threads)
                sess = ort.InferenceSession(model, opts, ["CPUExecutionProvider"])
                runs[label] = lambda s=sess, f=feed: s.run(None, f)
            iters = args.iters * (10 if rows < 128 else 2)
            summary = paired_summary(
                interleaved_ms(runs, warmup=args.warmup, iters=iters), "separate"
            )
            sep, mer = summary["separate"], summary["merged"]
            lines.append(
                f"| {name} | {rows} | {sep['median_ms'] * 1000:.1f} | "
                f"{mer['median_ms'] * 1000:.1f} | {mer['paired_ratio']:.2f} "
                f"[{mer['p10']:.2f}-{mer['p90']:.2f}] |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("variants", nargs="*", metavar="LABEL=PATH")
    parser.add_argument("--past", type=int, default=128)
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--skip-norm-kernel", action="store_true")
    parser.add_argument("--merge-kernel", action="store_true")
    args = parser.parse_args(argv)
    if args.merge_kernel:
        print(merge_kernel(args))
        return 0
    if args.skip_norm_kernel:
        print(skip_norm_kernel(args))
        return 0
    if not args.variants:
        parser.error("give at least one LABEL=PATH (the first is the base)")
    paths = {}
    for item in args.variants:
        label, sep, path = item.partition("=")
        if not sep or not Path(path).is_file():
            parser.error(f"{item!r}: expected LABEL=PATH of an existing model")
        paths[label] = Path(path)
    results = measure(paths, args)
    print(markdown(results, args))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
