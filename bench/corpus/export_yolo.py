"""Export YOLOv8n (ultralytics' yaml config, seeded random weights) into the corpus.

Why: YOLO-style detectors are what many users bring (Conv + SiLU everywhere, a Detect
head that decodes boxes with Shape/Range/Concat arithmetic, fully dynamic spatial
dims), and issue 13 saw both their SiLU chains left unfused and the check choosing
sizes at which the original cannot run. The wheel corpus has one real YOLOv8n
(nudenet's); this adds the same network from both torch exporters
(``_torch_yolo.py``): ultralytics' own exporter (TorchScript, opset 17, dynamic,
onnxslim) and torch's dynamo exporter (opset 18), at 320x320.

ultralytics needs torchvision, and PyPI's torchvision does not import beside the
project's torch 2.13.0 (CPU build); so the export runs in a side venv under the cache,
``venv-yolo``, with torch 2.14.1 and torchvision 0.29.1 from PyPI (a CUDA build, about
6 GB, installed once; nothing else is fetched from anywhere but the package registry).
The main venv then checks each file (``onnx.checker``; onnxruntime with optimizations
off against torch's outputs at 1x3x320x320 and 2x3x256x384) and writes its meta.json.

    python bench/corpus/export_yolo.py [--cache DIR] [--force]
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
from pathlib import Path

import _torch_sidevenv as sidevenv
import meta
import numpy as np
import onnx
from _torch_check import check_file, check_outputs

log = logging.getLogger("export_yolo")
HERE = Path(__file__).resolve().parent
PINS = [
    "torch==2.14.1",
    "torchvision==0.29.1",
    "ultralytics==8.4.190",
    "onnx==1.23.2",
    "onnxscript==0.7.2",
    "onnxslim==0.1.98",
    "onnxruntime==1.32.0",
]
EXPORTERS = {"torchscript": "torch-torchscript", "dynamo": "torch-dynamo"}
OPSETS = {"torchscript": 17, "dynamo": 18}
ATOL, RTOL = 1e-4, 1e-4  # box coordinates reach ~500 pixels: a relative part is needed
RECIPE = 2
# The dynamo export names its spatial dims "32*h" and "32*w"; the check sizes such a dim
# by its value (h = 7 for a 224 image), so no shapes are given for it (recipe 2).
SHAPES: dict[str, list[dict[str, int]]] = {}
SHAPES_NOTE = ""
SILU = "silu|conv_activation"  # x * Sigmoid(x), alone or into its Conv


def source(exporter: str) -> dict:
    how = {
        "torchscript": "ultralytics YOLO.export(format=onnx, dynamic=True, opset=17)",
        "dynamo": "torch.onnx.export(dynamo=True, opset_version=18)",
    }[exporter]
    return {
        "kind": "export",
        "pin": " ".join(PINS[:3]),
        "config": "ultralytics yolov8n.yaml, nc=80, imgsz=320",
        "exporter": how,
        "opset": OPSETS[exporter],
        "recipe": RECIPE,
    }


def count_silu(graph: onnx.GraphProto) -> int:
    """Mul(x, Sigmoid(x)) pairs: the SiLUs (the Detect head's class Sigmoid is not one)."""
    sigmoid_input = {n.output[0]: n.input[0] for n in graph.node if n.op_type == "Sigmoid"}
    pairs = [tuple(n.input) for n in graph.node if n.op_type == "Mul" and len(n.input) == 2]
    return sum(sigmoid_input.get(a) == b or sigmoid_input.get(b) == a for a, b in pairs)


def expected(graph: onnx.ModelProto) -> tuple[dict, str]:
    """Every SiLU fused on onnxruntime (issue 13: SiLU chains); generic keeps them."""
    silus = count_silu(graph.graph)
    notes = (
        f"{silus} SiLUs written x * Sigmoid(x), one after each Conv but the head's last: "
        "each must fuse on onnxruntime (issue 13); the generic target keeps them (ONNX "
        "Swish, opset 24, runs slower than the pair), so it requires only exit 0 and a "
        "passing check. BatchNorm is already folded by the exporter. Spatial dims are "
        "fully dynamic (multiples of 32)."
    )
    return {"generic": {}, "onnxruntime": {SILU: silus} if silus else {}}, notes


def write_one(models: Path, exporter: str, folder: Path) -> meta.ModelMeta:
    path = folder / meta.MODEL_FILE
    check_file(path)
    arrays = np.load(folder / "cases.npz")
    cases = [
        ({"images": arrays[f"in{i}"]}, [arrays[f"out{i}"]])
        for i in range(len([k for k in arrays if k.startswith("in")]))
    ]
    err = check_outputs(path, cases, atol=ATOL, rtol=RTOL)
    graph = onnx.load(str(path), load_external_data=False)
    exp, notes = expected(graph)
    entry = meta.ModelMeta(
        name=f"yolov8n_{exporter}",
        family="yolo",
        source=source(exporter),
        exporter=EXPORTERS[exporter],
        **meta.describe(path),
        expected=exp,
        shapes=SHAPES.get(exporter, []),
        notes=f"max abs diff vs torch {err:.2g} (atol {ATOL}, rtol {RTOL}). {notes}"
        + (SHAPES_NOTE if exporter in SHAPES else ""),
    )
    target = models / entry.name
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    shutil.move(str(path), target / meta.MODEL_FILE)
    meta.write(models, entry)
    return entry


def export(cache: Path, *, force: bool = False) -> list[str]:
    models = meta.models_dir(cache)
    models.mkdir(parents=True, exist_ok=True)
    todo = [e for e in EXPORTERS if force or not meta.is_current(models, f"yolov8n_{e}", source(e))]
    if not todo:
        log.info("yolov8n: current")
        return []
    python = sidevenv.ensure(cache / "venv-yolo", PINS)
    with tempfile.TemporaryDirectory(dir=models, prefix=".yolo.") as tmp:
        config_dir = Path(tmp) / "ultralytics-config"  # its settings file, not ~/.config
        sidevenv.run_worker(
            python,
            HERE / "_torch_yolo.py",
            ["--out", tmp, "--only", *todo],
            env={"YOLO_CONFIG_DIR": str(config_dir), "YOLO_OFFLINE": "1"},
            cwd=tmp,
        )
        for exporter in todo:
            entry = write_one(models, exporter, Path(tmp) / f"yolov8n_{exporter}")
            log.info(
                "%s: %d nodes, %.1f MiB", entry.name, entry.node_count, entry.size_bytes / 2**20
            )
    return [f"yolov8n_{e}" for e in todo]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cache", help="corpus cache (default ~/.cache/autofusion-corpus)")
    parser.add_argument("--force", action="store_true", help="export again even if current")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s %(levelname)s %(message)s")
    log.setLevel(logging.INFO)
    logging.getLogger("export_torch").setLevel(logging.INFO)  # the side venv's messages
    export(meta.cache_dir(args.cache), force=args.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
