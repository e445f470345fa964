"""Prefill and one-token latency of a big synthetic decoder, original against fused (issue 29).

    python bench/big_latency.py ORIGINAL.onnx FUSED.onnx [--prefill 128] [--iters 5] [--warmup 1]

The synthetic decoder (``bench/_big_models.py``) has no KV cache, so its two steps are a
prefill of ``--prefill`` tokens and a one-token step: a forward of one token with no
past, which, as a decode step, reads every weight once (memory-bound; its attention is
over one key, so it is the decode step less the cache's reads). Batch 1, ``ORT_ENABLE_ALL``,
``--threads`` threads, both sessions alive, the two models timed interleaved and paired
by round (``bench/_interleaved.py``, as ``bench/corpus/bench_llm.py``). The first
logits of both are compared first. Prints one JSON object: medians, paired ratios with
p10-p90, the max abs diff, each session's creation seconds and this process's peak RSS
(VmHWM). Run it in a process of its own: two sessions of a big model hold two packed
copies of its weights.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from _interleaved import interleaved_ms, paired_summary

from autofusion.fusion_core.profiling import session_options


def feeds(length: int, vocab: int, seed: int = 0) -> dict[str, np.ndarray]:
    ids = np.random.default_rng(seed).integers(3, vocab, (1, length), dtype=np.int64)
    return {
        "input_ids": ids,
        "attention_mask": np.ones((1, length), np.int64),
        "position_ids": np.arange(length, dtype=np.int64)[None],
    }


def peak_rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("original", type=Path)
    parser.add_argument("fused", type=Path)
    parser.add_argument("--prefill", type=int, default=128)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    sessions, created = {}, {}
    for label, path in (("original", args.original), ("fused", args.fused)):
        start = time.perf_counter()
        options = session_options("ORT_ENABLE_ALL", args.threads)
        sessions[label] = ort.InferenceSession(str(path), options, ["CPUExecutionProvider"])
        created[label] = round(time.perf_counter() - start, 2)
    vocab = sessions["original"].get_outputs()[0].shape[-1]
    short = feeds(8, vocab)
    logits = {k: s.run(None, short)[0].astype(np.float32) for k, s in sessions.items()}
    out = {"max_abs_diff": float(np.abs(logits["fused"] - logits["original"]).max()),
           "session_s": created, "iters": args.iters, "prefill_tokens": args.prefill}  # fmt: skip
    for step, length in (("prefill", args.prefill), ("one_token", 1)):
        step_feeds = feeds(length, vocab)
        runs = {k: (lambda s=s, f=step_feeds: s.run(None, f)) for k, s in sessions.items()}
        times = interleaved_ms(runs, warmup=args.warmup, iters=args.iters)
        out[step] = paired_summary(times, "original")
    out["peak_rss_bytes"] = peak_rss_bytes()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
