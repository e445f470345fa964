"""Packed attention (``attention_packed*``, ``fusion_core/patterns/builtin/
attention_packed.yaml``) against autofusion's default without it, on BERT-base,
DistilBERT and ViT-base, paired and interleaved.

Why: issue 17 part 3 says onnxscript's ``ort_fusions`` is 1-2% faster on BERT-base and
DistilBERT because it packs the Q/K/V projections into com.microsoft.Attention; the
packing is a default because this measured it level or faster (docs/benchmarks.md,
section 16). Each model is built by ``bench/bench_transformers.py`` (config defaults,
seeded random weights, dynamo export, batch 1, sequence 128 or ViT's 224 x 224 image),
optimized for onnxruntime with the defaults (``default``) and with the packing excluded
(``unpacked``, the base of the ratios), and by onnxscript's ``ort_fusions``
(``bench/_tools.py``), each compared with torch's output, and the four are timed at
ORT_ENABLE_ALL, ``--threads`` threads, interleaved (``bench/_interleaved.py``).

    python bench/corpus/bench_packed_attention.py [--models bert distilbert vit]
        [--iters 100]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

HERE = Path(__file__).resolve()
sys.path[:0] = [str(HERE.parents[2]), str(HERE.parents[1])]
import bench_transformers as bt  # noqa: E402
from _interleaved import interleaved_ms, paired_summary  # noqa: E402
from _tools import _onnxscript_ort_fusions  # noqa: E402

from autofusion.fusion_core import CheckOptions, OptimizeConfig, load_model, optimize  # noqa: E402
from autofusion.fusion_core.profiling import session_options  # noqa: E402

PACKED = ["attention_packed", "attention_packed_merged"]  # the patterns under test
bt.MODELS["distilbert"] = (
    bt.transformers.DistilBertConfig, bt.transformers.DistilBertModel, {}, "bert",
)  # fmt: skip


def variants(src: Path, tmp: Path) -> dict[str, Path]:
    paths = {"original": src}
    for label, exclude in (("unpacked", PACKED), ("default", [])):
        config = OptimizeConfig(
            target="onnxruntime", exclude=exclude, check=CheckOptions(enabled=False)
        )
        result = optimize(load_model(src), config)
        print(f"  {label}: {dict(sorted(result.counts.items()))}", flush=True)
        paths[label] = tmp / f"{label}.onnx"
        onnx.save(result.to_proto(), str(paths[label]))
    # what issue 17 compares against: onnxscript's ort_fusions packs Q/K/V the same way
    paths["ort_fusions"] = tmp / "ort_fusions.onnx"
    fused = _onnxscript_ort_fusions(src, paths["ort_fusions"], {})["fused"]
    print(f"  ort_fusions: {dict(sorted(fused.items()))}", flush=True)
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["bert", "distilbert", "vit"])
    parser.add_argument("--iters", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    for name in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            src = Path(tmp) / "model.onnx"
            feeds, info, _ = bt.export(name, "eager", src)
            paths = variants(src, Path(tmp))
            opts = session_options("ORT_ENABLE_ALL", args.threads)
            sessions = {
                k: ort.InferenceSession(str(p), opts, ["CPUExecutionProvider"])
                for k, p in paths.items()
            }
            for label, sess in sessions.items():
                got = sess.run(None, feeds)[0]
                err = float(np.abs(got - info["expected"]).max())
                print(f"  {label}: max abs diff vs torch {err:.2g}", flush=True)
            runs = {k: (lambda s=s, f=feeds: s.run(None, f)) for k, s in sessions.items()}
            summary = paired_summary(
                interleaved_ms(runs, warmup=args.warmup, iters=args.iters), "unpacked"
            )
            print(f"{name} (eager, batch 1, {args.threads} threads):")
            for label, row in summary.items():
                print(
                    f"| {label} | {row['median_ms']:.2f} ms | {row['paired_ratio']:.3f} "
                    f"[{row['p10']:.3f}-{row['p90']:.3f}] |"
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
