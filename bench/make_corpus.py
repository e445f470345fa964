"""Export the benchmark corpus: nine real architectures with seeded random weights.

Why this script exists: ``bench/bench_tools.py`` compares autofusion with the ONNX
optimizers people use today on the networks they use them on. Nothing is downloaded
(no pretrained weights): every network is built from its architecture with seeded
random weights and exported by torch's dynamo exporter at opset 18.

* CNNs, batch 1, 3x224x224, input ``input``, output ``logits``: ResNet-50
  (``make_resnet_models.py``), MobileNetV3-Large, EfficientNet-B0, ConvNeXt-Tiny,
  DenseNet-121 (``_cnn_models.py``; timm cannot be imported without torchvision, see
  there). Exported in inference mode with ``optimize=False``: the exporter's onnxscript
  pass would fold every BatchNormalization into its Conv, and BN fusion is part of what
  is compared. The BN count is checked (53 / 46 / 49 / 121; ConvNeXt has LayerNorms
  instead).
* Transformers from their transformers config defaults (``bench_transformers.build``
  and ``export``: eager attention, dynamic batch and sequence axes, the exporter's
  default ``optimize=True``): BERT-base, DistilBERT, GPT-2 (inputs ``input_ids`` and
  ``attention_mask``, 1x128) and ViT-base (``pixel_values``, 1x3x224x224); one output,
  ``last_hidden_state``.

Each file is checked against torch in onnxruntime with all graph optimizations
disabled (max abs diff), and its inputs are saved beside it (``<name>.inputs.npz``),
so every benchmark feeds the same seeded values. ``manifest.json`` describes each
model (file, bytes, parameters, nodes, op counts, BN count, inputs, export seconds,
max abs diff). Models already in the folder (file, inputs and manifest entry) are
skipped unless ``--force``.

    python bench/make_corpus.py [--out ~/.cache/autofusion-bench/corpus]
        [--models resnet50 distilbert ...] [--force]
"""

from __future__ import annotations

import argparse
import collections
import gc
import json
import logging
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _cnn_models
import bench_transformers as bt
import make_resnet_models as mrm

torch = bt.torch
transformers = bt.transformers
logger = logging.getLogger("make_corpus")

DEFAULT_OUT = Path.home() / ".cache" / "autofusion-bench" / "corpus"
IMAGE = 224
SEQUENCE = bt.SEQUENCE  # 128
ATTENTION = "eager"
# DistilBERT beside bench_transformers' bert / gpt2 / vit: the same wrapper and export;
# onnxruntime.transformers.optimizer handles it as model_type "bert".
bt.MODELS.setdefault(
    "distilbert", (transformers.DistilBertConfig, transformers.DistilBertModel, {}, "bert")
)
# corpus name -> (kind, builder key); kind "cnn" or a bench_transformers.MODELS key
CORPUS = {
    "resnet50": ("cnn", "resnet50"),
    "mobilenetv3_large": ("cnn", "mobilenetv3_large"),
    "efficientnet_b0": ("cnn", "efficientnet_b0"),
    "convnext_tiny": ("cnn", "convnext_tiny"),
    "densenet121": ("cnn", "densenet121"),
    "bert_base": ("transformer", "bert"),
    "distilbert": ("transformer", "distilbert"),
    "gpt2": ("transformer", "gpt2"),
    "vit_base": ("transformer", "vit"),
}
EXPECTED_BN = {
    "resnet50": 53,
    "mobilenetv3_large": 46,
    "efficientnet_b0": 49,
    "convnext_tiny": 0,
    "densenet121": 121,
}
ATOL = 1e-3  # full-size random-weight networks; the diff itself is recorded


def build_cnn(key: str):
    if key == "resnet50":
        return mrm.build_model(1.0, 1000)
    return _cnn_models.build(key)


def export_cnn(name: str, key: str, path: Path) -> tuple[dict, np.ndarray, int, dict]:
    model = build_cnn(key)
    params = sum(p.numel() for p in model.parameters())
    x = torch.randn((1, 3, IMAGE, IMAGE), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        mrm.export_dynamo(model, x, path)  # optimize=False: BatchNormalization kept
        expected = model(x).numpy()
    return {"input": x.numpy()}, expected, params, {"dynamic": False, "optimize": False}


def export_transformer(name: str, key: str, path: Path) -> tuple[dict, np.ndarray, int, dict]:
    feeds, ref, dynamic = bt.export(key, ATTENTION, path)
    config = ref["config"]
    model, _ = bt.build(key, ATTENTION)  # the same seed: the same weights as exported
    params = sum(p.numel() for p in model.parameters())
    extra = {
        "dynamic": dynamic,
        "optimize": True,
        "attention": ATTENTION,
        "ort_model_type": bt.MODELS[key][3],
        "num_heads": _first_attr(config, "num_attention_heads", "n_head", "n_heads"),
        "hidden_size": _first_attr(config, "hidden_size", "n_embd", "dim"),
    }
    return feeds, ref["expected"], params, extra


def _first_attr(config, *names: str) -> int:
    return int(next(getattr(config, n) for n in names if hasattr(config, n)))


def check_with_onnxruntime(path: Path, feeds: dict, expected: np.ndarray) -> float:
    """Max abs diff of the raw graph (ORT_DISABLE_ALL) against torch."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    if got.shape != expected.shape:
        raise RuntimeError(f"{path.name}: onnxruntime shape {got.shape}, torch {expected.shape}")
    return float(np.abs(got - expected).max())


def describe(path: Path) -> dict:
    model = onnx.load(str(path), load_external_data=False)
    ops = collections.Counter(
        f"{n.domain}.{n.op_type}" if n.domain not in ("", "ai.onnx") else n.op_type
        for n in model.graph.node
    )
    inits = {i.name for i in model.graph.initializer}
    return {
        "bytes": path.stat().st_size,
        "opset": next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None),
        "nodes": len(model.graph.node),
        "op_counts": dict(sorted(ops.items())),
        "bn_nodes": ops.get("BatchNormalization", 0),
        "inputs": [i.name for i in model.graph.input if i.name not in inits],
        "outputs": [o.name for o in model.graph.output],
    }


def export_one(name: str, out: Path) -> dict:
    kind, key = CORPUS[name]
    path = out / f"{name}.onnx"
    start = time.perf_counter()
    exporter = export_cnn if kind == "cnn" else export_transformer
    feeds, expected, params, extra = exporter(name, key, path)
    seconds = time.perf_counter() - start
    np.savez(out / f"{name}.inputs.npz", **feeds)
    diff = check_with_onnxruntime(path, feeds, expected)
    entry = {
        "name": name,
        "kind": kind,
        "file": path.name,
        "inputs_file": f"{name}.inputs.npz",
        "params": int(params),
        "export_seconds": round(seconds, 2),
        "max_abs_diff_vs_torch": diff,
        "output_max_abs": float(np.abs(expected).max()),
        "input_shapes": {k: list(v.shape) for k, v in feeds.items()},
        **extra,
        **describe(path),
    }
    if entry["bn_nodes"] != EXPECTED_BN.get(name, 0):
        raise RuntimeError(
            f"{name}: {entry['bn_nodes']} BatchNormalization nodes, expected "
            f"{EXPECTED_BN.get(name, 0)} (did the exporter fold them?)"
        )
    if diff > ATOL:
        raise RuntimeError(f"{name}: onnxruntime differs from torch by {diff:.3g} > {ATOL}")
    return entry


def load_manifest(out: Path) -> dict:
    path = out / "manifest.json"
    return json.loads(path.read_text()) if path.exists() else {"models": {}}


def is_cached(out: Path, manifest: dict, name: str) -> bool:
    entry = manifest["models"].get(name)
    return bool(entry) and (out / entry["file"]).exists() and (out / entry["inputs_file"]).exists()


def generate(out: Path, names: list[str], *, force: bool = False) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    manifest = load_manifest(out)
    manifest["versions"] = {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "onnx": onnx.__version__,
        "onnxruntime": ort.__version__,
        "architectures": "ResNet-50: make_resnet_models.py; other CNNs: _cnn_models.py "
        "(torchvision definitions; timm needs torchvision)",
    }
    for name in names:
        if not force and is_cached(out, manifest, name):
            print(f"{name}: cached ({manifest['models'][name]['file']})", flush=True)
            continue
        print(f"{name}: exporting", flush=True)
        entry = export_one(name, out)
        manifest["models"][name] = entry
        (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        print(
            f"  {entry['export_seconds']:.1f} s, {entry['params'] / 1e6:.1f} M params, "
            f"{entry['nodes']} nodes, {entry['bn_nodes']} BN, "
            f"max abs diff vs torch {entry['max_abs_diff_vs_torch']:.1e}",
            flush=True,
        )
        gc.collect()
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"(default {DEFAULT_OUT})")
    parser.add_argument("--models", nargs="+", choices=list(CORPUS), default=list(CORPUS))
    parser.add_argument("--force", action="store_true", help="export again even if cached")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    generate(args.out.expanduser(), args.models, force=args.force)


if __name__ == "__main__":
    main()
