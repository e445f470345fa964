"""A real architecture at 0.5-0.6 billion weights: optimum's export, autofusion, the builder.

    python bench/bench_real_big_decoder.py --genai DIR [--family qwen2|qwen3]
        [--work /tmp/af-real] [--iters 10]

1. In optimum-onnx's side venv (``bench/corpus/_torch_kvcache.py``'s, made once in the
   corpus cache), ``bench/_real_decoder_export.py`` builds Qwen2-0.5B's configuration
   (``--family qwen2``, the default) or Qwen3-0.6B's (``qwen3``: per-head q/k RMSNorms)
   with seeded random weights (nothing from a hub), saves it (``<work>/hf``) and exports it with
   ``text-generation-with-past`` (``<work>/optimum/model.onnx`` with external data).
2. onnxruntime-genai 0.18.0's model builder on the same folder, fp32 for the CPU, in this
   interpreter (the builder imports transformers 5's classes: not the side venv's 4.57)
   with ``--genai`` on ``PYTHONPATH`` (``pip install --target DIR --no-deps
   onnxruntime-genai==0.18.0``): ``python -m onnxruntime_genai.models.builder -i hf -o
   builder -p fp32 -e cpu``. Without ``--genai`` the builder's row is left out.
3. ``autofusion optimize`` (target onnxruntime, check on) on the export, in a child: its
   report's peak memory (VmHWM) and time by phase.
4. Prefill (128 tokens) and decode (1 token after 128) of the three, batch 1, interleaved
   and paired (``bench/corpus/bench_llm.py`` in a child, ``--iters`` rounds), and each
   variant's decode logits against the original's, one session at a time.

Steps whose files exist in ``--work`` (default ``/tmp/af-real``, ``/tmp/af-real-qwen3``
for Qwen3) are not redone. Prints JSON lines, then Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "corpus"))
import _torch_kvcache  # noqa: E402  (bench/corpus is not a package)
import _torch_sidevenv as sidevenv  # noqa: E402
import bench_llm as timing  # noqa: E402
import meta  # noqa: E402

WORK = {"qwen2": Path("/tmp/af-real"), "qwen3": Path("/tmp/af-real-qwen3")}
CLI = [sys.executable, "-c", "import sys; from autofusion.app.cli import main; sys.exit(main())"]


def side_python() -> Path:
    return sidevenv.ensure(meta.cache_dir() / "venv-optimum", _torch_kvcache.PINS)


def export(work: Path, family: str) -> dict:
    start = time.perf_counter()
    env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # never a model hub
    script = HERE / "_real_decoder_export.py"
    argv = ["--out", str(work), "--family", family]
    sidevenv.run_worker(side_python(), script, argv, env=env, timeout_s=3600)
    return {"export_s": round(time.perf_counter() - start, 1)}


def build(work: Path, genai: Path) -> dict:
    start = time.perf_counter()
    command = [sys.executable, "-m", "onnxruntime_genai.models.builder",
               "-i", str(work / "hf"), "-o", str(work / "builder"),
               "-p", "fp32", "-e", "cpu"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(genai), HF_HUB_OFFLINE="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"the model builder failed:\n{done.stderr[-3000:]}")
    return {"builder_s": round(time.perf_counter() - start, 1)}


def optimize(work: Path) -> dict:
    out = work / "autofusion"
    out.mkdir(exist_ok=True)
    report = out / "report.json"
    command = [*CLI, "optimize", str(work / "optimum" / "model.onnx"),
               "-o", str(out / "model.onnx"), "--target", "onnxruntime",
               "--report", str(report)]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    data = json.loads(report.read_text()) if report.is_file() else {}
    own, check = data.get("optimize_memory") or {}, data.get("check") or {}
    return {
        "exit": done.returncode,
        "wall_s": round(time.perf_counter() - start, 1),
        "model_bytes": own.get("model_bytes"),
        "peak_rss_bytes": own.get("peak_rss_bytes"),
        "predicted_peak_bytes": own.get("predicted_peak_bytes"),
        "timings_s": data.get("timings_s"),
        "nodes": data.get("nodes"),
        "fusions": data.get("fusions"),
        "check": (check.get("passed"), check.get("max_abs_diff")),
        "check_dims": [p.get("dims") for p in check.get("profiles", [])],
        "fallback": data.get("fallback"),
        "tail": done.stdout[-1500:] + done.stderr[-1500:] if done.returncode else "",
    }


def head_size(hf: Path) -> int:
    """The saved config's head size: ``head_dim`` where it is set (Qwen3's 128 is not
    hidden / heads), else hidden / heads."""
    config = json.loads((hf / "config.json").read_text())
    return config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]


def decode_diffs(paths: dict[str, Path], past: int) -> dict[str, float]:
    """Max abs difference of each variant's decode logits from the original's, on the same
    tokens and cache, one session alive at a time."""
    logits, base = {}, None
    for name, path in paths.items():
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = timing.feeds(session, past=past, new=1)
        base = base or feeds
        logits[name] = session.run(None, {k: base[k] for k in feeds})[0][:, -1]
        del session
    return {n: float(np.abs(v - logits["original"]).max()) for n, v in logits.items()}


def latency(paths: dict[str, Path], args) -> dict:
    out = args.work / "latency.json"
    command = [sys.executable, str(HERE / "corpus" / "bench_llm.py"),
               *(f"{k}={v}" for k, v in paths.items()), "--iters", str(args.iters),
               "--warmup", str(args.warmup), "--json", str(out)]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True)
    print(done.stdout, done.stderr[-2000:], flush=True)
    return json.loads(out.read_text()) if out.is_file() else {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=sorted(WORK), default="qwen2")
    parser.add_argument("--work", type=Path, help="default: /tmp/af-real[-qwen3]")
    parser.add_argument("--genai", type=Path, help="onnxruntime-genai installed with --target")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    args = parser.parse_args(argv)
    args.work = args.work or WORK[args.family]
    args.work.mkdir(parents=True, exist_ok=True)
    if not (args.work / "optimum" / "model.onnx").is_file():
        print(json.dumps(export(args.work, args.family)), flush=True)
    if args.genai and not (args.work / "builder" / "model.onnx").is_file():
        print(json.dumps(build(args.work, args.genai)), flush=True)
    fused = optimize(args.work)
    print(json.dumps(fused), flush=True)
    paths = {"original": args.work / "optimum" / "model.onnx"}
    if fused["exit"] == 0:
        paths["autofusion"] = args.work / "autofusion" / "model.onnx"
    if args.genai:
        paths["builder"] = timing.with_head_size(
            args.work / "builder" / "model.onnx", head_size(args.work / "hf")
        )
    print(json.dumps({"decode_logits_max_abs_diff": decode_diffs(paths, past=128)}), flush=True)
    latency(paths, args)


if __name__ == "__main__":
    main()
