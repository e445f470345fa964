"""Generate ResNet-50 ONNX models with BatchNormalization kept, from both torch exporters.

Why this script exists: the fusion tests and benchmarks need a realistic
Conv -> BatchNormalization -> Relu network (ResNet-50) in which the BN nodes
have *not* already been folded away by the exporter, and they need it in the two
graph "dialects" torch produces: the legacy TorchScript exporter and the dynamo
(torch.export + onnxscript) exporter. The two differ in opset/ir_version, node
naming, the ops around Conv (dynamo feeds each Conv a zero bias computed at run
time) and per-node metadata, and the fusion passes must handle both.

The network is defined here (same module names/structure as torchvision's
resnet50) instead of importing torchvision, which is not a dependency, and so
that a ``width_multiplier`` can produce an architecturally identical but tiny
network for checked-in test files. BN statistics/affine parameters are
randomized with a fixed seed so that folding BN into Conv is non-trivial.

torch is an optional extra of this project: it is only needed to *regenerate*
the models, never to use or test the library (written against torch 2.13.0).
Usage:

    python bench/make_resnet_models.py --small             # -> tests/data/resnet/
    python bench/make_resnet_models.py --out DIR [--width 1.0] [--size 224]
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

try:
    import torch
    from torch import nn
except ImportError:  # torch is an optional extra; fail with a useful message
    sys.exit("make_resnet_models.py needs torch: pip install -e '.[torch]' (torch==2.13.0)")

SEED = 0
TORCHSCRIPT_OPSET = 17
# The dynamo exporter has no implementations below opset 18: asking for 17
# makes it export at 18 and then try a down-conversion, which fails on the
# unoptimized graph (ReduceMean axes is not a constant) and keeps 18 anyway.
DYNAMO_OPSET = 18
ATOL = 1e-4
EXPECTED_BN = 53  # 1 stem + 16 blocks * 3 + 4 downsample; independent of width
SMALL = dict(width=1 / 8, size=32, num_classes=10, prefix="resnet50_w8")
SMALL_OUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "resnet"
# Guard against accidentally checking in a big model. At width 1/8 the weights
# alone are ~1.5 MB (they scale with width**2), and the dynamo file adds ~0.6 MB
# of per-node metadata (stack traces, module paths), so 1 MB is not reachable.
SMALL_MAX_BYTES = 3 << 20


class Bottleneck(nn.Module):
    """torchvision's ResNet v1.5 bottleneck: stride on the 3x3 conv, expansion 4."""

    expansion = 4

    def __init__(
        self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None
    ) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    """ResNet-50 with torchvision's module names; widths scaled by width_multiplier."""

    def __init__(self, width_multiplier: float = 1.0, num_classes: int = 1000) -> None:
        super().__init__()
        widths = [max(1, round(w * width_multiplier)) for w in (64, 128, 256, 512)]
        self.inplanes = widths[0]
        self.conv1 = nn.Conv2d(3, self.inplanes, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(widths[0], 3, stride=1)
        self.layer2 = self._make_layer(widths[1], 4, stride=2)
        self.layer3 = self._make_layer(widths[2], 6, stride=2)
        self.layer4 = self._make_layer(widths[3], 3, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(widths[3] * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        out_planes = planes * Bottleneck.expansion
        downsample = None
        if stride != 1 or self.inplanes != out_planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, out_planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(out_planes),
            )
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = out_planes
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def build_model(width: float, num_classes: int) -> nn.Module:
    """Seeded ResNet-50 with non-trivial BN parameters, in inference mode."""
    torch.manual_seed(SEED)
    model = ResNet50(width, num_classes)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                # Default BN (mean 0, var 1, weight 1, bias 0) is ~identity, so
                # a broken fold could still pass numerics; randomize all four.
                m.running_mean.normal_(0.0, 0.1)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.uniform_(0.5, 1.5)
                m.bias.normal_(0.0, 0.1)
    return model.train(False)  # inference mode (same as .eval())


def export_torchscript(model: nn.Module, x: torch.Tensor, path: Path) -> None:
    # PRESERVE keeps the module's own (inference) mode, and no constant
    # folding, so the exporter does not fold BN into the preceding Conv.
    torch.onnx.export(
        model,
        (x,),
        str(path),
        dynamo=False,
        training=torch.onnx.TrainingMode.PRESERVE,
        do_constant_folding=False,
        opset_version=TORCHSCRIPT_OPSET,
        input_names=["input"],
        output_names=["logits"],
    )


def export_dynamo(model: nn.Module, x: torch.Tensor, path: Path) -> None:
    # optimize=False is required: the default onnxscript optimization pass
    # fuses every BatchNormalization into its Conv. The price is the raw
    # translation of aten.convolution: each bias-less Conv gets a zero bias
    # computed at run time (Shape -> Expand -> CastLike -> Expand).
    # external_data=False: one self-contained file (the default writes the
    # weights to a side "<name>.data" file).
    program = torch.onnx.export(
        model,
        (x,),
        dynamo=True,
        optimize=False,
        opset_version=DYNAMO_OPSET,
        input_names=["input"],
        output_names=["logits"],
    )
    program.save(str(path), external_data=False)


EXPORTERS = {"torchscript": export_torchscript, "dynamo": export_dynamo}


def check_with_onnxruntime(path: Path, x: torch.Tensor, expected: np.ndarray) -> float:
    """Run the raw graph (no ORT optimizations, so no ORT-side BN fusion) and compare."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    (got,) = sess.run(None, {sess.get_inputs()[0].name: x.numpy()})
    if got.shape != expected.shape:
        raise RuntimeError(
            f"{path.name}: onnxruntime output shape {got.shape}, torch {expected.shape}"
        )
    max_err = float(np.abs(got - expected).max())
    if max_err > ATOL:
        raise RuntimeError(
            f"{path.name}: onnxruntime output differs from torch "
            f"(max abs err {max_err:.3g} > atol {ATOL})"
        )
    return max_err


def validate(path: Path, x: torch.Tensor, expected: np.ndarray, max_bytes: int | None) -> float:
    """Check that the file is valid, self-contained, kept all BN nodes and runs."""
    if (path.parent / (path.name + ".data")).exists():
        raise RuntimeError(f"{path.name}: unexpected external data file")
    if max_bytes is not None and path.stat().st_size > max_bytes:
        raise RuntimeError(f"{path.name}: {path.stat().st_size} bytes > {max_bytes}")
    onnx.checker.check_model(str(path))
    n_bn = op_counts(onnx.load(str(path)))["BatchNormalization"]
    if n_bn != EXPECTED_BN:
        raise RuntimeError(
            f"{path.name}: {n_bn} BatchNormalization nodes, "
            f"expected {EXPECTED_BN} (did the exporter fold BN?)"
        )
    return check_with_onnxruntime(path, x, expected)


def op_counts(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node)


def describe(path: Path) -> str:
    model = onnx.load(str(path))
    counts = op_counts(model)
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    ops = ", ".join(f"{op}={n}" for op, n in sorted(counts.items()))
    return (
        f"{path}: {path.stat().st_size / 1024:.1f} KiB, ir_version={model.ir_version}, "
        f"opset={opset}, initializers={len(model.graph.initializer)}, "
        f"BatchNormalization={counts['BatchNormalization']}\n  ops: {ops}\n"
    )


def generate(
    out_dir: Path,
    prefix: str,
    width: float,
    size: int,
    num_classes: int,
    max_bytes: int | None = None,
) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    model = build_model(width, num_classes)
    x = torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(SEED))
    with torch.no_grad():
        expected = model(x).numpy()
    for name, export in EXPORTERS.items():
        path = out_dir / f"{prefix}_{name}.onnx"
        start = time.perf_counter()
        export(model, x, path)
        elapsed = time.perf_counter() - start
        max_err = validate(path, x, expected, max_bytes)
        sys.stdout.write(
            f"[{name}] exported in {elapsed:.1f}s; onnxruntime matches "
            f"torch (max abs err {max_err:.2g})\n{describe(path)}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, help="output directory")
    parser.add_argument("--width", type=float, default=1.0, help="width multiplier")
    parser.add_argument("--size", type=int, default=224, help="input height = width")
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument(
        "--small",
        action="store_true",
        help=f"write the tiny test models (width 1/8, 32x32, 10 classes) "
        f"into {SMALL_OUT}; ignores --width/--size/--num-classes",
    )
    args = parser.parse_args(argv)
    if args.small:
        generate(
            args.out or SMALL_OUT,
            SMALL["prefix"],
            SMALL["width"],
            SMALL["size"],
            SMALL["num_classes"],
            max_bytes=SMALL_MAX_BYTES,
        )
    elif args.out is None:
        parser.error("--out is required unless --small is given")
    else:
        generate(args.out, "resnet50", args.width, args.size, args.num_classes)


if __name__ == "__main__":
    main()
