"""Decoder LLM latency: the original export against the fused graphs (issue 17).

The model is the corpus' ``llm_bench_llama_optimum_kv`` (bench/corpus/build.py): a Llama
with 4 layers, hidden 512, 8 query heads sharing 2 KV heads, vocabulary 8192, random
weights, exported by optimum-onnx's ``text-generation-with-past`` (one graph with a KV
cache that runs the prefill, with an empty cache, and every decode step). Variants:

- ``original``: the export as it is;
- ``autofusion``: ``fusion_core.optimize`` with its defaults, target onnxruntime;
- ``ort_fusions``: onnxscript's ``onnxscript.rewriter.ort_fusions.optimize_for_ort``;
- ``ort_optimizer``: ``onnxruntime.transformers.optimizer.optimize_model`` (model type
  gpt2, the decoder type it has), where it runs;
- ``model_builder``: onnxruntime-genai's model builder output for the same weights
  (``--builder FOLDER``: ``python -m onnxruntime_genai.models.builder -i hf -o FOLDER
  -p fp32 -e cpu``; the corpus' ``hf/`` is the ``save_pretrained`` folder; the builder
  also wants a tokenizer, which any will do for the graph).

Two steps, batch 1: prefill (128 tokens, empty cache) and decode (1 token after 128),
each with every variant timed interleaved at ORT_ENABLE_ALL with ``--threads`` threads
(bench/_interleaved.py): medians, and the median of the ratios paired by iteration to
the original with p10-p90. A decode step streams every weight once, so the achieved
bandwidth is the weights' bytes over the decode median. The logits of each variant are
compared with the original's first (the model builder computes its positions from the
mask, so all variants are fed positions 0..L-1 and a mask of ones).

    python bench/bench_llm.py [--model DIR] [--builder FOLDER] [--iters 200] [--threads 2]
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from fusion_core import OptimizeConfig, optimize, save_model
from fusion_core.profiling import session_options

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _interleaved import interleaved_ms, paired_summary

CORPUS = Path(os.environ.get("AUTOFUSION_CORPUS_DIR", Path.home() / ".cache/autofusion-corpus"))
DEFAULT_MODEL = CORPUS / "models" / "llm_bench_llama_optimum_kv"
PREFILL, PAST = 128, 128


def fuse_autofusion(src: Path, out: Path) -> str:
    result = optimize(src, OptimizeConfig(target="onnxruntime"))
    save_model(result.model, out)
    check = result.check
    return f"{len(result.applied)} fusions, check {'passed' if check and check.passed else check}"


def fuse_ort_fusions(src: Path, out: Path) -> str:
    import onnx_ir as ir
    from onnxscript.rewriter import ort_fusions

    model = ir.load(src)
    _, counts = ort_fusions.optimize_for_ort(model)
    ir.save(model, out)
    return f"fusions {dict((k, v) for k, v in counts.items() if v)}"


def fuse_ort_optimizer(src: Path, out: Path) -> str:
    from onnxruntime.transformers import optimizer

    model = optimizer.optimize_model(str(src), model_type="gpt2", num_heads=8, hidden_size=512)
    model.save_model_to_file(str(out))
    return f"fused ops {model.get_fused_operator_statistics()}"


def feeds_for(session: ort.InferenceSession, step: str, kv_heads: int, size: int) -> dict:
    """Batch 1: 128 new tokens and an empty cache, or 1 token after 128."""
    rng = np.random.default_rng(0)
    new, past = (PREFILL, 0) if step == "prefill" else (1, PAST)
    feeds = {}
    for value in session.get_inputs():
        name = value.name
        if name == "input_ids":
            feeds[name] = rng.integers(0, 8192, (1, new)).astype(np.int64)
        elif name == "attention_mask":
            feeds[name] = np.ones((1, past + new), np.int64)
        elif name == "position_ids":
            feeds[name] = np.arange(past, past + new, dtype=np.int64)[None]
        elif name.startswith("past_key_values"):
            feeds[name] = rng.standard_normal((1, kv_heads, past, size)).astype(np.float32)
        else:
            raise SystemExit(f"unexpected input {name!r}")
    return feeds


def weight_bytes(path: Path) -> int:
    model = onnx.load(str(path))
    return sum(
        int(np.prod(t.dims)) * np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.data_type)).itemsize
        for t in model.graph.initializer
    )


def prepare(args, tmp: Path) -> tuple[dict[str, Path], dict[str, str]]:
    src = args.model / "model.onnx"
    paths, notes = {"original": src}, {"original": f"{len(onnx.load(str(src)).graph.node)} nodes"}
    for name, fuse in (
        ("autofusion", fuse_autofusion),
        ("ort_fusions", fuse_ort_fusions),
        ("ort_optimizer", fuse_ort_optimizer),
    ):
        out = tmp / f"{name}.onnx"
        try:
            notes[name] = fuse(src, out)
            paths[name] = out
        except Exception as err:  # record why; the other variants still count
            traceback.print_exc()
            notes[name] = f"failed: {type(err).__name__}: {str(err)[:200]}"
    if args.builder is not None:
        paths["model_builder"] = args.builder / "model.onnx"
        notes["model_builder"] = "onnxruntime-genai model builder"
    for name, path in paths.items():
        nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
        notes[name] = f"{nodes} nodes; {notes[name]}"
    return paths, notes


def measure(paths: dict[str, Path], step: str, args) -> tuple[dict, dict]:
    sessions = {
        name: ort.InferenceSession(
            str(p),
            session_options("ORT_ENABLE_ALL", args.threads),
            providers=["CPUExecutionProvider"],
        )
        for name, p in paths.items()
    }
    feeds = {n: feeds_for(s, step, 2, 64) for n, s in sessions.items()}
    # the same tokens, positions and cache for every variant
    base = feeds["original"]
    feeds = {n: {k: base[k] for k in f} for n, f in feeds.items()}
    logits = {n: s.run(None, feeds[n])[0] for n, s in sessions.items()}
    diffs = {n: float(np.abs(v - logits["original"]).max()) for n, v in logits.items()}
    runs = {n: (lambda s=s, f=feeds[n]: s.run(None, f)) for n, s in sessions.items()}
    times = interleaved_ms(runs, warmup=args.warmup, iters=args.iters)
    return paired_summary(times, "original"), diffs


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--builder", type=Path, default=None, help="model builder output folder")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", nargs="+", default=["prefill", "decode"])
    parser.add_argument("--variants", nargs="+", default=None, help="only these variants")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        paths, notes = prepare(args, Path(folder))
        weights = weight_bytes(args.model / "model.onnx")
        print(
            f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; "
            f"onnxruntime {ort.__version__}; {args.threads} threads, {args.iters} interleaved "
            f"runs after {args.warmup}; weights {weights / 1e6:.1f} MB"
        )
        for name, note in notes.items():
            print(f"- {name}: {note}")
        if args.variants:
            paths = {n: p for n, p in paths.items() if n in args.variants or n == "original"}
        for step in args.steps:
            summary, diffs = measure(paths, step, args)
            what = "128 tokens, empty cache" if step == "prefill" else "1 token, 128 past"
            print(f"\n{step} ({what})\n")
            print(
                "| variant | median ms | vs original (p10-p90) | max abs logit diff |"
                + (" GB/s |" if step == "decode" else "")
            )
            print("| --- | ---: | ---: | ---: |" + (" ---: |" if step == "decode" else ""))
            for name, s in summary.items():
                rate = f" {weights / s['median_ms'] / 1e6:.1f} |" if step == "decode" else ""
                print(
                    f"| {name} | {s['median_ms']:.2f} | {s['paired_ratio']:.3f} "
                    f"({s['p10']:.3f}-{s['p90']:.3f}) | {diffs[name]:.1e} |{rate}"
                )


if __name__ == "__main__":
    main()
