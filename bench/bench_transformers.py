"""autofusion against ``onnxruntime.transformers.optimizer`` on full-size transformers.

For each model (BERT-base by default; GPT-2 and ViT-base on request), built
from its transformers config defaults with seeded random weights (nothing is
downloaded) and exported with the dynamo exporter (opset 18), one run:

1. times ``fusion_core.optimize`` (target onnxruntime, check disabled) and
   ``onnxruntime.transformers.optimizer.optimize_model`` (its default
   ``opt_level`` for the model type unless ``--ort-opt-level``), ``--repeat``
   runs each, interleaved, median;
2. measures latency at batch 1 (sequence 128 for text models, 224x224 for ViT)
   with ``intra_op_num_threads`` threads of five sessions: the original and
   the ORT-optimizer output at onnxruntime's default level (ORT_ENABLE_ALL),
   the autofusion output at ORT_ENABLE_ALL and at ORT_DISABLE_ALL, and the
   original at ORT_DISABLE_ALL, all with thread spinning off. After
   ``--warmup`` runs each, the sessions are run in turn every iteration
   (the starting session rotates), so drift of the machine hits all alike;
3. prints Markdown tables: medians, p90s, the ratios of paired medians and
   the optimize-time ratio the issue asks for, and autofusion's fusion counts.

The builders and wrappers come from ``bench/make_transformer_models.py``
(needs the ``torch`` extra).

    python bench/bench_transformers.py [--models bert gpt2 vit] [--attn eager sdpa]
        [--repeat 3] [--iters 50] [--threads 2]
"""

from __future__ import annotations

import argparse
import collections
import gc
import logging
import platform
import statistics
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import onnxruntime as ort
from onnxruntime.transformers import optimizer as ort_optimizer

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize, save_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_transformer_models as mtm

torch = mtm.torch
transformers = mtm.transformers

SEQUENCE = 128
IMAGE = 224
# model name -> (config class, model class, model kwargs, ORT model_type)
MODELS = {
    "bert": (transformers.BertConfig, transformers.BertModel, {"add_pooling_layer": False}, "bert"),
    "gpt2": (transformers.GPT2Config, transformers.GPT2Model, {}, "gpt2"),
    "vit": (transformers.ViTConfig, transformers.ViTModel, {"add_pooling_layer": False}, "vit"),
}
SESSIONS = (
    ("original", "all"),
    ("ort-optimizer", "all"),
    ("autofusion", "all"),
    ("autofusion", "disabled"),
    ("original", "disabled"),
)
LEVELS = {
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
    "disabled": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}


def build(name: str, attn: str):
    config_cls, model_cls, model_kwargs, _ = MODELS[name]
    kwargs = {"attn_implementation": attn}
    if name == "gpt2":
        kwargs["use_cache"] = False  # no DynamicCache output
    config = config_cls(**kwargs)
    torch.manual_seed(0)
    model = model_cls(config, **model_kwargs)
    if model.config._attn_implementation != attn:
        raise RuntimeError(f"{name}: transformers chose {model.config._attn_implementation!r}")
    wrapper = mtm.ImageLastHiddenState if name == "vit" else mtm.TextLastHiddenState
    return wrapper(model).train(False), config


def inputs_for(name: str, config) -> dict:
    gen = torch.Generator().manual_seed(0)
    if name == "vit":
        return {"pixel_values": torch.randn((1, 3, IMAGE, IMAGE), generator=gen)}
    ids = torch.randint(0, config.vocab_size, (1, SEQUENCE), generator=gen)
    return {"input_ids": ids, "attention_mask": torch.ones(1, SEQUENCE, dtype=torch.int64)}


def export(name: str, attn: str, path: Path) -> tuple[dict, dict, bool]:
    model, config = build(name, attn)
    inputs = inputs_for(name, config)
    # make_transformer_models bounds the dynamic sequence axis by its tiny
    # position table; the full-size models have 512 (BERT) / 1024 (GPT-2).
    mtm.MAX_POSITIONS = getattr(config, "max_position_embeddings", None) or getattr(
        config, "n_positions", 512
    )
    with torch.no_grad():
        try:
            mtm.export_dynamo(model, inputs, path, dynamic=True)
            dynamic = True
        except Exception as err:  # fall back to static shapes
            print(f"  dynamic export failed ({type(err).__name__}); static shapes", flush=True)
            mtm.export_dynamo(model, inputs, path, dynamic=False)
            dynamic = False
        expected = model(**inputs).numpy()
    feeds = {k: v.numpy() for k, v in inputs.items()}
    return feeds, {"expected": expected, "config": config}, dynamic


def time_optimizers(src: Path, name: str, config, repeat: int, opt_level: int | None) -> dict:
    ort_type = MODELS[name][3]
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    af_config = OptimizeConfig(target="onnxruntime", check=CheckOptions(enabled=False))
    af_times, ort_times = [], []
    af_result = ort_model = ort_error = None
    for _ in range(repeat):
        gc.collect()
        start = time.perf_counter()
        af_result = optimize(src, af_config)
        af_times.append(time.perf_counter() - start)
        if ort_error is not None:
            continue
        gc.collect()
        start = time.perf_counter()
        try:
            ort_model = ort_optimizer.optimize_model(
                str(src),
                model_type=ort_type,
                num_heads=heads,
                hidden_size=hidden,
                opt_level=opt_level,
            )
        except Exception as err:  # record it; the autofusion rows still count
            ort_error = f"{type(err).__name__}: {err}"
            traceback.print_exc()
            continue
        ort_times.append(time.perf_counter() - start)
    return {
        "af_times": af_times,
        "ort_times": ort_times,
        "af_result": af_result,
        "ort_model": ort_model,
        "ort_error": ort_error,
    }


def session(path: Path, level: str, threads: int) -> ort.InferenceSession:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = LEVELS[level]
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    # Without this the idle sessions' pool threads spin after each run and
    # take the CPUs from the session being timed (~4x slower BERT on 2 vCPUs).
    opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


def latency(paths: dict, feeds: dict, expected, threads: int, warmup: int, iters: int) -> dict:
    sessions = {k: session(paths[k[0]], k[1], threads) for k in SESSIONS if k[0] in paths}
    out = {}
    for key, sess in sessions.items():
        (got,) = sess.run(None, feeds)
        out[key] = {"max_abs_diff": float(np.abs(got - expected).max()), "times": []}
        for _ in range(warmup):
            sess.run(None, feeds)
    keys = list(sessions)
    for i in range(iters):
        for j in range(len(keys)):
            key = keys[(i + j) % len(keys)]
            start = time.perf_counter()
            sessions[key].run(None, feeds)
            out[key]["times"].append(time.perf_counter() - start)
    for r in out.values():
        t = sorted(r["times"])
        r["median"] = statistics.median(t)
        r["p90"] = float(np.percentile(t, 90))
    return out


def ops(model_proto) -> dict:
    counts: dict[str, int] = {}
    for node in model_proto.graph.node:
        counts[node.op_type] = counts.get(node.op_type, 0) + 1
    return counts


def run_one(name: str, attn: str, args, tmp: Path) -> str:
    tag = f"{name}/{attn}/dynamo"
    print(f"== {tag}: exporting", flush=True)
    src = tmp / f"{name}_{attn}.onnx"
    start = time.perf_counter()
    feeds, ref, dynamic = export(name, attn, src)
    print(f"  exported in {time.perf_counter() - start:.1f}s (dynamic={dynamic})", flush=True)
    print("  timing optimizers", flush=True)
    t = time_optimizers(src, name, ref["config"], args.repeat, args.ort_opt_level)
    af_path, ort_path = tmp / f"{name}_{attn}_af.onnx", tmp / f"{name}_{attn}_ortopt.onnx"
    save_model(t["af_result"].model, af_path)
    paths = {"original": src, "autofusion": af_path}
    if t["ort_model"] is not None:
        t["ort_model"].save_model_to_file(str(ort_path))
        paths["ort-optimizer"] = ort_path
    print("  measuring latency", flush=True)
    lat = latency(paths, feeds, ref["expected"], args.threads, args.warmup, args.iters)
    af_med = statistics.median(t["af_times"])
    ort_med = statistics.median(t["ort_times"]) if t["ort_times"] else float("nan")
    m = collections.defaultdict(lambda: float("nan"), {k: v["median"] for k, v in lat.items()})
    lines = [
        f"### {tag} (dynamic axes: {dynamic})",
        "",
        f"optimize time, median of {args.repeat}: autofusion {af_med:.2f} s "
        f"(runs {', '.join(f'{x:.2f}' for x in t['af_times'])}), "
        f"onnxruntime.transformers.optimizer {ort_med:.2f} s "
        f"(runs {', '.join(f'{x:.2f}' for x in t['ort_times'])}); "
        f"ratio autofusion / ORT optimizer = **{af_med / ort_med:.2f}** (target <= 0.20)",
        "",
        f"latency, batch 1, {args.threads} intra-op threads, {args.warmup} warm-up, "
        f"{args.iters} interleaved runs each:",
        "",
        "| model | ORT level | median ms | p90 ms | max abs diff vs torch |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    for key in lat:
        r = lat[key]
        lines.append(
            f"| {key[0]} | {key[1]} | {r['median'] * 1e3:.2f} | {r['p90'] * 1e3:.2f} "
            f"| {r['max_abs_diff']:.1e} |"
        )
    r1 = m[("autofusion", "all")] / m[("ort-optimizer", "all")]
    r2 = m[("autofusion", "disabled")] / m[("original", "all")]
    r3 = m[("autofusion", "all")] / m[("original", "all")]
    lines += [
        "",
        "| ratio of medians (lower is faster) | value | issue target |",
        "| --- | ---: | --- |",
        f"| optimize time: autofusion / ORT optimizer | {af_med / ort_med:.3f} | <= 0.20 |",
        f"| autofusion @all / ORT-optimizer output @all | {r1:.3f} | <= 1.00 |",
        f"| autofusion @disabled / original @all | {r2:.3f} | <= 1.00 |",
        f"| (info) autofusion @all / original @all | {r3:.3f} | |",
        f"| (info) original @disabled / original @all "
        f"| {m[('original', 'disabled')] / m[('original', 'all')]:.3f} | |",
        "",
    ]
    res = t["af_result"]
    counts = ", ".join(f"{k} {v}" for k, v in sorted(res.counts.items())) or "none"
    ort_ops = ops(t["ort_model"].model) if t["ort_model"] is not None else {}
    ort_fused = {
        k: v
        for k, v in ort_ops.items()
        if k
        in (
            "Attention",
            "MultiHeadAttention",
            "SkipLayerNormalization",
            "EmbedLayerNormalization",
            "LayerNormalization",
            "BiasGelu",
            "FastGelu",
            "Gelu",
            "SkipSimplifiedLayerNormalization",
        )
    }
    lines += [
        f"autofusion fusions ({res.rounds} rounds): {counts}",
        "",
        "ORT optimizer output, fused op counts: "
        + (", ".join(f"{k} {v}" for k, v in sorted(ort_fused.items())) or "none")
        + f" (opt_level {args.ort_opt_level if args.ort_opt_level is not None else 'default'})",
        "",
    ]
    if t["ort_error"]:
        lines += [f"ORT optimizer FAILED: {t['ort_error']}", ""]
    text = "\n".join(lines)
    print(text, flush=True)
    for p in (src, af_path, ort_path):
        p.unlink(missing_ok=True)
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=["bert"])
    parser.add_argument("--attn", nargs="+", choices=["eager", "sdpa"], default=["eager"])
    parser.add_argument("--repeat", type=int, default=3, help="optimize runs per tool (median)")
    parser.add_argument("--iters", type=int, default=50, help="timed runs per session")
    parser.add_argument("--warmup", type=int, default=10, help="untimed runs per session")
    parser.add_argument("--threads", type=int, default=2, help="intra_op_num_threads")
    parser.add_argument(
        "--ort-opt-level",
        type=int,
        choices=[0, 1, 2, 99],
        default=None,
        help="opt_level for optimize_model (default: its default for the model type)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    print(
        f"{platform.processor() or platform.machine()}, python {platform.python_version()}, "
        f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"onnxruntime {ort.__version__}\n",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="bench-transformers-") as tmp:
        for name in args.models:
            for attn in args.attn:
                try:
                    run_one(name, attn, args, Path(tmp))
                except Exception as err:  # report and go on with the next model
                    print(f"{name}/{attn}: FAILED {type(err).__name__}: {err}", flush=True)
                    traceback.print_exc()


if __name__ == "__main__":
    main()
