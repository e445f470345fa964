"""A mixture-of-experts block as exported against the com.microsoft.MoE autofusion makes.

Why: issue 24 asks for the experts as onnxruntime's ``MoE`` where its CPU kernel is
exact and measures faster. The corpus' Qwen3-MoE is small (4 experts of 128); this
times one layer's ``Qwen3MoeSparseMoeBlock`` (transformers, random weights, its
``batched_mm`` experts: what both torch exporters can trace) at sizes up to a Qwen3-30B-A3B
layer's proportions, exported by TorchScript (opset 17) and dynamo, each against its
autofusion output (target onnxruntime: the block becomes one MoE), at ORT_ENABLE_ALL with
``--threads`` threads, interleaved (``bench/_interleaved.py``): the medians and the
median of the ratios paired by iteration with p10-p90, for 1 token (a decode step) and
``--tokens`` tokens (a prefill). The outputs of the two are compared first (max abs
difference).

    python bench/bench_moe.py [--sizes small mid large] [--tokens 128] [--threads 2]
        [--iters 100]

Needs the corpus extra (torch, transformers): ``make .venv/.corpus-installed``.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _interleaved import interleaved_ms, paired_summary

from autofusion.fusion_core import OptimizeConfig, optimize, save_model
from autofusion.fusion_core.profiling import session_options

# name -> (hidden, experts, top k, expert FFN width)
SIZES = {
    "small": (256, 4, 2, 128),  # the corpus' Qwen3-MoE
    "mid": (1024, 32, 4, 512),
    "large": (2048, 64, 8, 768),  # Qwen3-30B-A3B's widths, half its 128 experts
}


def export(size: str, exporter: str, path: Path) -> None:
    import torch
    import transformers
    from transformers.models.qwen3_moe import modeling_qwen3_moe as qm

    hidden, experts, k, ffn = SIZES[size]
    config = transformers.Qwen3MoeConfig(
        hidden_size=hidden, num_experts=experts, num_experts_per_tok=k,
        moe_intermediate_size=ffn, norm_topk_prob=True,
    )  # fmt: skip
    config._experts_implementation = "batched_mm"
    torch.manual_seed(0)
    block = qm.Qwen3MoeSparseMoeBlock(config).train(False)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, hidden**-0.5)
    x = torch.randn(1, 8, hidden)
    dynamic = {"x": {0: "batch", 1: "seq"}}
    if exporter == "dynamo":
        batch, seq = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=4096)
        torch.onnx.export(
            block, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=True,
            dynamic_shapes={"hidden_states": {0: batch, 1: seq}}, external_data=False,
        )  # fmt: skip
    else:
        torch.onnx.export(
            block, (x,), str(path), input_names=["x"], output_names=["y"], dynamo=False,
            opset_version=17, dynamic_axes=dynamic,
        )  # fmt: skip


def measure(paths: dict[str, Path], tokens: int, args) -> dict:
    hidden = SIZES[args.size][0]
    feed = {
        "x": np.random.default_rng(tokens).standard_normal((1, tokens, hidden)).astype(np.float32)
    }
    sessions = {
        name: ort.InferenceSession(
            str(p), session_options("ORT_ENABLE_ALL", args.threads), ["CPUExecutionProvider"]
        )
        for name, p in paths.items()
    }
    outs = {n: s.run(None, feed)[0] for n, s in sessions.items()}
    base = next(iter(paths))
    diff = max(float(np.abs(o - outs[base]).max()) for o in outs.values())
    runs = {n: (lambda s=s: s.run(None, feed)) for n, s in sessions.items()}
    iters = args.iters if tokens == 1 else max(20, args.iters // 4)
    summary = paired_summary(interleaved_ms(runs, warmup=10, iters=iters), base)
    return {"diff": diff, "summary": summary}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--iters", type=int, default=100)
    args = parser.parse_args(argv)
    print(f"{platform.machine()}, {os.cpu_count()} CPUs, onnxruntime {ort.__version__}, "
          f"ORT_ENABLE_ALL, {args.threads} threads")  # fmt: skip
    print()
    print("| size (hidden, experts, k, FFN) | exporter | tokens | exported ms | MoE ms "
          "| paired ratio [p10-p90] | max abs diff |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for size in args.sizes:
            args.size = size
            for exporter in ("torchscript", "dynamo"):
                src = Path(folder) / f"{size}_{exporter}.onnx"
                export(size, exporter, src)
                result = optimize(src, OptimizeConfig(target="onnxruntime"))
                moe = result.ops_after.get("com.microsoft::MoE", 0)
                if not moe:
                    misses = [m.reason for m in result.near_misses if m.pattern.startswith("moe_")]
                    print(f"| {size} | {exporter} | - | - | no MoE: {misses[:1]} | | |")
                    continue
                out = Path(folder) / f"{size}_{exporter}_moe.onnx"
                save_model(result.model, out)
                for tokens in (1, args.tokens):
                    m = measure({"exported": src, "moe": out}, tokens, args)
                    a, b = m["summary"]["exported"], m["summary"]["moe"]
                    print(
                        f"| {size} {SIZES[size]} | {exporter} | {tokens} "
                        f"| {a['median_ms']:.3f} | {b['median_ms']:.3f} "
                        f"| {b['paired_ratio']:.3f} [{b['p10']:.3f}-{b['p90']:.3f}] "
                        f"| {m['diff']:.1e} |",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
