"""Decoder LLM latency: the original export against the fused graphs (issue 17).

The model is the corpus' ``llm_bench_llama_optimum_kv`` (bench/corpus/build.py): a Llama
with 4 layers, hidden 512, 8 query heads sharing 2 KV heads, vocabulary 8192, random
weights, exported by optimum-onnx's ``text-generation-with-past`` (one graph with a KV
cache that runs the prefill, with an empty cache, and every decode step). Variants:

- ``original``: the export as it is;
- ``autofusion``: ``fusion_core.optimize`` with its defaults, target onnxruntime;
- ``autofusion_without_moe``: the same without its mixture-of-experts patterns, for a
  model with a router (a TopK): the ratio of the two is what ``com.microsoft.MoE`` gains;
- ``ort_fusions``: onnxscript's ``onnxscript.rewriter.ort_fusions.optimize_for_ort``;
- ``ort_optimizer``: ``onnxruntime.transformers.optimizer.optimize_model`` (model type
  gpt2, the decoder type it has), where it runs;
- ``model_builder``: onnxruntime-genai's model builder output for the same weights
  (``--builder FOLDER``: ``python -m onnxruntime_genai.models.builder -i hf -o FOLDER
  -p fp32 -e cpu``; the corpus' ``hf/`` is the ``save_pretrained`` folder; the builder
  also wants a tokenizer, which any will do for the graph).

Two steps, batch 1: prefill (128 tokens, empty cache) and decode (1 token after 128),
each with every variant timed interleaved at ORT_ENABLE_ALL with ``--threads`` threads,
by ``bench/corpus/bench_llm.py`` (its feeds, timing and table): medians, the median of
the ratios paired by iteration to the original with p10-p90, and the decode step's
achieved bandwidth (the weights it streams over its median). The decode logits of each
variant are compared with the original's first (the model builder computes positions
from the mask, so every variant gets positions 0..L-1 and a mask of ones).

    python bench/bench_llm.py [--model DIR] [--builder FOLDER] [--iters 200] [--threads 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import platform
import tempfile
import traceback
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from autofusion.fusion_core import OptimizeConfig, optimize, save_model
from autofusion.fusion_core.profiling import session_options

# the timing, feeds and table of bench/corpus/bench_llm.py (paired, interleaved)
_spec = importlib.util.spec_from_file_location(
    "corpus_bench_llm", Path(__file__).resolve().parent / "corpus" / "bench_llm.py"
)
timing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(timing)  # type: ignore[union-attr]

CORPUS = Path(os.environ.get("AUTOFUSION_CORPUS_DIR", Path.home() / ".cache/autofusion-corpus"))
DEFAULT_MODEL = CORPUS / "models" / "llm_bench_llama_optimum_kv"


def fuse_autofusion(src: Path, out: Path) -> str:
    result = optimize(src, OptimizeConfig(target="onnxruntime"))
    save_model(result.model, out)
    check = result.check
    return f"{len(result.applied)} fusions, check {'passed' if check and check.passed else check}"


MOE_PATTERNS = [  # every pattern that makes a com.microsoft.MoE
    "moe_softmax_topk",
    "moe_softmax_cast_topk",
    "moe_topk_softmax",
    "moe_sigmoid_topk",
    "moe_sigmoid_topk_values",
    "moe_topk_pick_sigmoid",
    "moe_softmax_pick",
    "moe_softmax_masked_topk",
    "moe_sparse_mixer",
]


def fuse_autofusion_without_moe(src: Path, out: Path) -> str:
    """autofusion with its mixture-of-experts patterns off: what the MoE kernel alone
    gains is the ratio of the two."""
    result = optimize(src, OptimizeConfig(target="onnxruntime", exclude=MOE_PATTERNS))
    save_model(result.model, out)
    return f"{len(result.applied)} fusions, no MoE"


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


def prepare(args, tmp: Path) -> tuple[dict[str, Path], dict[str, str]]:
    src = args.model / "model.onnx"
    paths, notes = {"original": src}, {"original": f"{len(onnx.load(str(src)).graph.node)} nodes"}
    moe = any(
        n.op_type in ("TopK",) for n in onnx.load(str(src), load_external_data=False).graph.node
    )
    fusers = [("autofusion", fuse_autofusion)]
    if moe:  # a router: the same fusions without com.microsoft.MoE, side by side
        fusers.append(("autofusion_without_moe", fuse_autofusion_without_moe))
    for name, fuse in (
        *fusers,
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
        cache = onnx.load(str(src), load_external_data=False).graph.input[-1]
        head = cache.type.tensor_type.shape.dim[3].dim_value  # the original's head size
        paths["model_builder"] = timing.with_head_size(args.builder / "model.onnx", head)
        notes["model_builder"] = "onnxruntime-genai model builder"
    for name, path in paths.items():
        nodes = len(onnx.load(str(path), load_external_data=False).graph.node)
        notes[name] = f"{nodes} nodes; {notes[name]}"
    return paths, notes


def logit_diffs(paths: dict[str, Path], args) -> dict[str, float]:
    """Max abs difference of each variant's decode logits from the original's, on the
    same tokens, positions and cache."""
    sessions = {
        name: ort.InferenceSession(
            str(p), session_options("ORT_ENABLE_ALL", args.threads), ["CPUExecutionProvider"]
        )
        for name, p in paths.items()
    }
    base = timing.feeds(sessions["original"], past=args.past, new=1)
    logits = {
        n: s.run(None, {k: base[k] for k in timing.feeds(s, past=0, new=1)})[0]
        for n, s in sessions.items()
    }
    return {n: float(np.abs(v - logits["original"]).max()) for n, v in logits.items()}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--builder", type=Path, default=None, help="model builder output folder")
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--past", type=int, default=128)
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--variants", nargs="+", default=None, help="only these variants")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        paths, notes = prepare(args, Path(folder))
        if args.variants:
            paths = {n: p for n, p in paths.items() if n in args.variants or n == "original"}
        print(f"{platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}")
        diffs = logit_diffs(paths, args)
        for name, note in notes.items():
            if name in paths:
                print(f"- {name}: {note}; decode logits max abs diff {diffs[name]:.1e}")
        print()
        print(timing.markdown(timing.measure(paths, args), args))


if __name__ == "__main__":
    main()
