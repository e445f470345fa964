"""Real architectures at real sizes: optimum's export, autofusion, the model builder.

    python bench/bench_real_big_decoder.py --genai DIR [--family FAMILY]
        [--work DIR] [--target-profile NAME] [--iters 10] [--steps 8]

1. In optimum-onnx's side venv (``bench/corpus/_torch_kvcache.py``'s, made once in the
   corpus cache), ``bench/_real_decoder_export.py`` builds the family with seeded random
   weights (nothing from a hub): Qwen2-0.5B's configuration (``--family qwen2``, the
   default), Qwen3-0.6B's (``qwen3``: per-head q/k RMSNorms), or one of the families both
   the builder and optimum take (gemma2, gemma3, granite, phi3, olmo, smollm3, nemotron)
   at hidden 1024, 8 layers, vocabulary 32000 in the family's head layout (that module's
   ``FAMILIES``); saves it (``<work>/hf``), torch's logits of a 16-token prompt
   (``<work>/reference.npz``), and exports it with ``text-generation-with-past``
   (``<work>/optimum/model.onnx`` with external data).
2. onnxruntime-genai 0.18.0's model builder on the same folder, fp32 for the CPU, in this
   interpreter (the builder imports transformers 5's classes: not the side venv's 4.57)
   with ``--genai`` on ``PYTHONPATH`` (``pip install --target DIR --no-deps
   onnxruntime-genai==0.18.0 onnx-ir==1.1.0``): ``python -m
   onnxruntime_genai.models.builder -i hf -o builder -p fp32 -e cpu --extra_options
   windowed_kv_cache=false`` through ``bench/_run_model_builder.py`` (Gemma-3's rope
   parameters as the builder reads them). Without ``--genai`` the builder's row is left out.
3. ``autofusion optimize`` (target onnxruntime, check on, ``--target-profile`` if given:
   then into ``<work>/autofusion-<profile>``) on the export, in a child: its report's peak
   memory (VmHWM) and time by phase.
4. The original's logits against torch's; each variant's logits against the original's:
   one decode step after a 128-token past, and ``--steps`` greedy steps of a batch of two
   with left padding on one row (``bench/_decoder_steps.py``), one session at a time.
5. Prefill (128 tokens) and decode (1 token after 128) of the three, batch 1, interleaved
   and paired (``bench/corpus/bench_llm.py`` in a child, ``--iters`` rounds), twice: created
   in the order original, autofusion, builder (ratios to the original) and then builder,
   autofusion, original (ratios to the builder), with the 1-minute load average before and
   after each.

Steps whose files exist in ``--work`` (default ``/tmp/af-real`` for Qwen2,
``/tmp/af-real-<family>`` for the others) are not redone, the optimization included when
its report is there. Prints JSON lines, then Markdown.
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
from _decoder_steps import steps_diffs  # noqa: E402
from _real_decoder_export import CONFIGS, FAMILIES  # noqa: E402

FAMILY_NAMES = sorted(CONFIGS | FAMILIES)
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
    command = [sys.executable, str(HERE / "_run_model_builder.py"),
               "-i", str(work / "hf"), "-o", str(work / "builder"),
               "-p", "fp32", "-e", "cpu", "-c", str(work / "builder-cache"),
               # a full-length cache on every layer, as optimum's graph takes: by default
               # the builder gives sliding-window layers a ring of the window's size,
               # which a growing past of 128 does not fill (GroupQueryAttention refuses)
               "--extra_options", "windowed_kv_cache=false"]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=str(genai), HF_HUB_OFFLINE="1")
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:  # the builder does not take every family: measure the rest
        return {"builder_failed": done.stderr.strip().splitlines()[-1:], "exit": done.returncode}
    return {"builder_s": round(time.perf_counter() - start, 1)}


def optimize(work: Path, profile: str | None) -> tuple[Path, dict]:
    """The fused model's path and a summary of its report; reused when the report exists."""
    out = work / (f"autofusion-{profile}" if profile else "autofusion")
    out.mkdir(exist_ok=True)
    report = out / "report.json"
    done, start = None, time.perf_counter()
    if not (report.is_file() and (out / "model.onnx").is_file()):
        command = [*CLI, "optimize", str(work / "optimum" / "model.onnx"),
                   "-o", str(out / "model.onnx"), "--target", "onnxruntime",
                   "--report", str(report)]  # fmt: skip
        command += ["--target-profile", profile] if profile else []
        done = subprocess.run(command, capture_output=True, text=True)
    data = json.loads(report.read_text()) if report.is_file() else {}
    own, check = data.get("optimize_memory") or {}, data.get("check") or {}
    summary = {
        "exit": done.returncode if done else 0,
        "reused": done is None,
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
        "rejected": data.get("rejected"),  # a pass or rule that raised: the run is suspect
        "tail": done.stdout[-1500:] + done.stderr[-1500:] if done and done.returncode else "",
    }
    return out / "model.onnx", summary


def export_diff(work: Path, original: Path) -> float:
    """Max abs difference of the original's prefill logits from torch's (the export's
    faithfulness: Gemma-2's soft-cap, Granite's multipliers)."""
    ref = np.load(work / "reference.npz")
    session = ort.InferenceSession(str(original), providers=["CPUExecutionProvider"])
    ids = ref["input_ids"]
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids)}
    names = {arg.name for arg in session.get_inputs()}
    if "position_ids" in names:
        feed["position_ids"] = np.arange(ids.shape[1], dtype=np.int64)[None]
    for arg in session.get_inputs():
        if arg.name.startswith("past_key_values."):
            feed[arg.name] = np.zeros((1, arg.shape[1], 0, arg.shape[3]), np.float32)
    logits = session.run(["logits"], feed)[0]
    return float(np.abs(logits - ref["logits"]).max())


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


def load1() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def latency(paths: dict[str, Path], args, tag: str) -> dict:
    """One bench_llm run over ``paths`` in their order (the first is the ratios' base)."""
    profile = f"-{args.target_profile}" if args.target_profile else ""
    out = args.work / f"latency-{tag}{profile}.json"
    command = [sys.executable, str(HERE / "corpus" / "bench_llm.py"),
               *(f"{k}={v}" for k, v in paths.items()), "--iters", str(args.iters),
               "--warmup", str(args.warmup), "--json", str(out)]  # fmt: skip
    before = load1()
    done = subprocess.run(command, capture_output=True, text=True)
    print(f"order {' -> '.join(paths)}; load1 {before} -> {load1()}", flush=True)
    print(done.stdout, done.stderr[-2000:], flush=True)
    results = json.loads(out.read_text()) if out.is_file() else {}
    results["load1"] = (before, load1())
    out.write_text(json.dumps(results, indent=1) + "\n")
    return results


def variants(args, fused: Path | None) -> dict[str, Path]:
    paths = {"original": args.work / "optimum" / "model.onnx"}
    if fused is not None:
        paths["autofusion"] = fused
    if args.genai:
        paths["builder"] = timing.with_head_size(
            args.work / "builder" / "model.onnx", head_size(args.work / "hf")
        )
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", choices=FAMILY_NAMES, default="qwen2")
    parser.add_argument("--work", type=Path, help="default: /tmp/af-real[-FAMILY]")
    parser.add_argument("--genai", type=Path, help="onnxruntime-genai installed with --target")
    parser.add_argument("--target-profile", help="autofusion's target profile (default cpu)")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8, help="greedy steps of the padded check")
    args = parser.parse_args(argv)
    default = "/tmp/af-real" + ("" if args.family == "qwen2" else f"-{args.family}")
    args.work = args.work or Path(default)
    args.work.mkdir(parents=True, exist_ok=True)
    if not (args.work / "optimum" / "model.onnx").is_file():
        print(json.dumps(export(args.work, args.family)), flush=True)
    if args.genai and not (args.work / "builder" / "model.onnx").is_file():
        built = build(args.work, args.genai)
        print(json.dumps(built), flush=True)
        args.genai = None if "builder_failed" in built else args.genai
    fused, summary = optimize(args.work, args.target_profile)
    print(json.dumps(summary), flush=True)
    paths = variants(args, fused if summary["exit"] == 0 else None)
    if (args.work / "reference.npz").is_file():
        print(json.dumps({"original_vs_torch": export_diff(args.work, paths["original"])}))
    print(json.dumps({"decode_logits_max_abs_diff": decode_diffs(paths, past=128)}), flush=True)
    print(json.dumps({"padded_steps": steps_diffs(paths, steps=args.steps)}), flush=True)
    latency(paths, args, "original-first")
    latency(dict(reversed(paths.items())), args, "builder-first")


if __name__ == "__main__":
    main()
