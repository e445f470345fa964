"""The YOLOv8n export worker: runs in ``export_yolo.py``'s side venv (torch 2.14, ultralytics).

Why a worker: ultralytics needs torchvision, which does not import beside the project's
torch, so this script runs in its own venv and hands back files only: for each export
``<out>/<name>/model.onnx`` and ``cases.npz`` (the inputs ``in<i>`` and torch's outputs
``out<i>`` at each checked size), which the main venv checks in onnxruntime.

The network is YOLOv8n built from ultralytics' own yaml config (``yolov8n.yaml``, 80
classes; nothing downloaded) with seeded random weights and randomized BatchNorm
statistics and affine parameters (``_torch_norms.randomize``): users' exports fold each
BatchNorm into its Conv, and a fold with identity statistics could not be wrong. Two
exports, each as its users make it:

* ``yolov8n_torchscript``: ultralytics' exporter, ``model.export(format="onnx",
  dynamic=True, opset=17)`` with its default onnxslim simplification (TorchScript
  exporter; BN folded, Conv -> Sigmoid -> Mul for each SiLU);
* ``yolov8n_dynamo``: the same network prepared as that exporter prepares it (BN fused,
  the Detect head in export mode), exported by ``torch.onnx.export(dynamo=True)`` at
  opset 18 with dynamic batch, height and width.
"""

from __future__ import annotations

import argparse
import copy
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch
from _torch_norms import randomize

SEED = 0
IMGSZ = 320
# (batch, height, width) the exports are checked at: the export size, then others
CHECK_SIZES = [(1, IMGSZ, IMGSZ), (2, 256, 384)]


def build():
    os.environ.setdefault("YOLO_OFFLINE", "1")  # no update checks, no downloads
    from ultralytics import YOLO

    torch.manual_seed(SEED)
    yolo = YOLO("yolov8n.yaml", task="detect")
    randomize(yolo.model, seed=SEED)
    return yolo


def export_mode(model):
    """The network as ultralytics' exporter prepares it: BN fused, Detect in export mode."""
    from ultralytics.nn.modules.head import Detect

    model = copy.deepcopy(model).eval().float()
    for param in model.parameters():
        param.requires_grad = False
    model = model.fuse()
    for module in model.modules():
        if isinstance(module, Detect):
            module.dynamic, module.export, module.format, module.shape = True, True, "onnx", None
    return model


def export_ultralytics(yolo, path: Path) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        weights = Path(tmp) / "yolov8n.pt"
        yolo.save(str(weights))  # the exporter names its file after the model's file
        from ultralytics import YOLO

        saved = YOLO(str(weights), task="detect")
        out = saved.export(format="onnx", imgsz=IMGSZ, dynamic=True, opset=17, device="cpu")
        shutil.move(out, path)


def export_dynamo(model, path: Path) -> None:
    x = torch.randn(1, 3, IMGSZ, IMGSZ)
    # height and width are multiples of the largest stride, 32
    height, width = torch.export.Dim("h", min=2, max=64), torch.export.Dim("w", min=2, max=64)
    shapes = {"x": {0: torch.export.Dim("batch"), 2: 32 * height, 3: 32 * width}}
    program = torch.onnx.export(
        model,
        (x,),
        dynamo=True,
        opset_version=18,
        input_names=["images"],
        output_names=["output0"],
        dynamic_shapes=shapes,
    )
    for node in program.model.graph.all_nodes():  # machine-specific paths, not graph
        node.metadata_props.pop("pkg.torch.onnx.stack_trace", None)
    program.save(str(path), external_data=False)


def save_cases(model, folder: Path) -> None:
    arrays = {}
    gen = torch.Generator().manual_seed(SEED)
    for i, (batch, height, width) in enumerate(CHECK_SIZES):
        x = torch.rand((batch, 3, height, width), generator=gen)  # images scaled to [0, 1]
        with torch.no_grad():
            y = model(x)
        arrays[f"in{i}"] = x.numpy()
        arrays[f"out{i}"] = (y[0] if isinstance(y, tuple | list) else y).numpy()
    np.savez(folder / "cases.npz", **arrays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", nargs="+", default=["torchscript", "dynamo"])
    args = parser.parse_args()
    yolo = build()
    reference = export_mode(yolo.model)
    for exporter in args.only:
        folder = args.out / f"yolov8n_{exporter}"
        folder.mkdir(parents=True, exist_ok=True)
        if exporter == "torchscript":
            export_ultralytics(yolo, folder / "model.onnx")
        else:
            export_dynamo(reference, folder / "model.onnx")
        save_cases(reference, folder)


if __name__ == "__main__":
    main()
