"""SiLU and HardSwish networks end to end: what fuses, how close, how fast (onnxruntime).

Two networks from ``_cnn_models.py`` (seeded random weights, BatchNorm statistics
randomized, nothing downloaded), batch 1, 3x224x224:

* ``mobilenetv3_decomposed``: MobileNetV3-Large with every HardSwish written
  ``x * relu6(x + 3) / 6`` and every HardSigmoid (the squeeze-excitation gates)
  ``relu6(x + 3) / 6``, as YOLOv5's export-friendly ``Hardswish`` and older MobileNetV3
  ports write them; exported, this is Add/Clip/Mul/Div (and Add/Clip/Div);
* ``efficientnet_b0``: EfficientNet-B0 with torch's ``nn.SiLU`` (Sigmoid + Mul).

Each is exported by TorchScript at opsets 11 and 12 and by dynamo at 18
(``make_resnet_models.export_*``: BatchNormalization kept). Each file is optimized by
``fusion_core.optimize`` (check on) for ``generic``, ``generic`` with
``upgrade_opset=14`` (below 14) and ``onnxruntime``. Per variant: the fusions, the max abs
diff against the original on one seeded input (both at ORT_DISABLE_ALL), and the
latency at ORT_ENABLE_ALL and ORT_DISABLE_ALL: one session per variant (``--threads``
intra-op threads, spinning off), ``--warmup`` then ``--iters`` runs interleaved with the
original's, the first rotating; the median and the median of the paired ratios to the
original with their 10th-90th percentile (below 1: faster).

    .venv/bin/python bench/bench_activation_models.py [--iters 40] [--warmup 5]
        [--threads 1] [--models mobilenetv3_decomposed efficientnet_b0] [--json out.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cnn_models
import make_resnet_models as mrm
from _interleaved import interleaved_ms, paired_summary
from _sessions import session  # one way to open a timed session, spinning off

from autofusion.fusion_core import CheckOptions, OptimizeConfig, optimize, save_model

LEVELS = ("ORT_ENABLE_ALL", "ORT_DISABLE_ALL")
EXPORTS = (("torchscript", 11), ("torchscript", 12), ("dynamo", 18))


class DecomposedHardswish(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * nn.functional.relu6(x + 3.0) / 6.0


class DecomposedHardsigmoid(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.relu6(x + 3.0) / 6.0


def _replace(module: nn.Module) -> None:
    for name, child in module.named_children():
        if isinstance(child, nn.Hardswish):
            setattr(module, name, DecomposedHardswish())
        elif isinstance(child, nn.Hardsigmoid):
            setattr(module, name, DecomposedHardsigmoid())
        else:
            _replace(child)


def build(name: str) -> nn.Module:
    if name == "mobilenetv3_decomposed":
        model = _cnn_models.build("mobilenetv3_large")
        _replace(model)
        return model
    return _cnn_models.build(name)


def export(model: nn.Module, exporter: str, opset: int, path: Path) -> None:
    x = torch.zeros(1, 3, 224, 224)
    if exporter == "torchscript":
        mrm.TORCHSCRIPT_OPSET = opset
        mrm.export_torchscript(model, x, path)
    else:
        mrm.DYNAMO_OPSET = opset
        mrm.export_dynamo(model, x, path)


def latency(paths: dict[str, Path], feeds: dict, level: str, args) -> dict:
    sessions = {label: session(p, level, args.threads) for label, p in paths.items()}
    runs = {label: functools.partial(sess.run, None, feeds) for label, sess in sessions.items()}
    times = interleaved_ms(runs, warmup=args.warmup, iters=args.iters)
    return paired_summary(times, base="original")


VARIANTS = {
    "generic": dict(target="generic"),
    "generic --upgrade-opset 14": dict(target="generic", upgrade_opset=14),
    "onnxruntime": dict(target="onnxruntime"),
}


def bench_file(path: Path, opset: int, folder: Path, feeds: dict, args) -> dict:
    paths, record = {"original": path}, {}
    for label, options in VARIANTS.items():
        if "upgrade_opset" in options and opset >= options["upgrade_opset"]:
            continue
        config = OptimizeConfig(**options, check=CheckOptions(samples=1))
        start = time.perf_counter()
        result = optimize(path, config)
        seconds = time.perf_counter() - start
        out = folder / f"{path.stem}.{label.replace(' ', '_')}.onnx"
        save_model(result.model, out)
        paths[label] = out
        reference = session(path, "ORT_DISABLE_ALL", args.threads).run(None, feeds)[0]
        fused = session(out, "ORT_DISABLE_ALL", args.threads).run(None, feeds)[0]
        record[label] = {
            "fusions": result.counts,
            "check": result.check.passed if result.check else None,
            "max_abs_diff": float(np.abs(reference - fused).max()),
            "optimize_s": seconds,
            "prepasses": [p for p in result.prepasses if p.startswith("upgrade_opset")],
        }
    for level in LEVELS:
        for label, lat in latency(paths, feeds, level, args).items():
            record.setdefault(label, {})[level] = lat
    return record


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--models", nargs="+", default=["mobilenetv3_decomposed", "efficientnet_b0"]
    )
    parser.add_argument("--iters", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    ort.set_default_logger_severity(3)
    feeds = {"input": np.random.default_rng(0).standard_normal((1, 3, 224, 224), np.float32)}
    results: dict = {}
    print(
        "| model | export | variant | fusions | check | max abs diff | ms @ALL "
        "| ratio @ALL (p10-p90) | ms @DISABLE | ratio @DISABLE (p10-p90) |"
    )
    print("| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: |")
    with tempfile.TemporaryDirectory(prefix="bench-activation-models-") as tmp:
        for name in args.models:
            model = build(name)
            for exporter, opset in EXPORTS:
                path = Path(tmp) / f"{name}_{exporter}{opset}.onnx"
                export(model, exporter, opset, path)
                record = bench_file(path, opset, Path(tmp), feeds, args)
                results[f"{name}/{exporter}{opset}"] = record
                for label, r in record.items():
                    fusions = ", ".join(f"{k} {v}" for k, v in sorted(r.get("fusions", {}).items()))
                    cells = [
                        fusions or "-",
                        str(r.get("check", "-")),
                        f"{r['max_abs_diff']:.1e}" if "max_abs_diff" in r else "-",
                    ]
                    for level in LEVELS:
                        lat = r[level]
                        cells += [
                            f"{lat['median_ms']:.2f}",
                            f"{lat['paired_ratio']:.3f} ({lat['p10']:.2f}-{lat['p90']:.2f})",
                        ]
                    print(
                        f"| {name} | {exporter} {opset} | {label} | " + " | ".join(cells) + " |",
                        flush=True,
                    )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
