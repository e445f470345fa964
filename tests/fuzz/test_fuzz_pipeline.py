"""Fuzz the whole pipeline: random valid graphs of the ops the patterns touch, at random
opsets from 11 to the newest onnxruntime runs, with fixed or dynamic batch and sequence,
through ``optimize`` on both targets (issue 25).

What must hold on every graph: no exception, no step taken back as a bug, the check
passes (after the fallback, which is the default), the model written loads in
onnxruntime (and passes onnx's full check on the generic target), and it computes what
the original computes (rtol 1e-4, atol 1e-5, fp32).

A graph is a chain of blocks drawn from what exporters write: convolutions with and
without bias, BatchNormalization with random statistics, activations written as ops and
written out (SiLU, HardSwish as x * Clip(x + 3, 0, 6) / 6, HardSigmoid), residual adds,
scales; or, for sequences, linear layers (MatMul + Add), LayerNorm and RMSNorm written
out or as the op, GELU (erf and tanh forms), Softmax, residual adds, and a flatten undone
by the tensor's own Shape (folded to a constant where the dims are fixed). Weights are
seeded and not degenerate. ``AUTOFUSION_FUZZ_EXAMPLES`` sets the example budget (20 in
``make test``, 200 in the corpus tier).
"""

from __future__ import annotations

import functools
import os

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.pipeline import optimize
from autofusion.fusion_core.validate import make_session, random_inputs

EXAMPLES = int(os.environ.get("AUTOFUSION_FUZZ_EXAMPLES", "20"))
TOL = {"rtol": 1e-4, "atol": 1e-5}
_F = onnx.TensorProto.FLOAT

IMAGE_BLOCKS = ("conv", "conv_bn", "bn", "relu", "sigmoid", "silu", "hard_swish", "clip6",
                "hard_sigmoid", "residual", "scale", "pool")  # fmt: skip
SEQUENCE_BLOCKS = ("linear", "layer_norm", "rms_norm", "gelu_erf", "gelu_tanh", "softmax",
                   "residual", "scale", "silu", "relu", "reshape")  # fmt: skip


@functools.cache
def newest_opset() -> int:
    """The newest default-domain opset onnxruntime loads (onnx may know newer ones)."""
    for opset in range(onnx.defs.onnx_opset_version(), 11, -1):
        graph = oh.make_graph(
            [oh.make_node("Identity", ["x"], ["y"])],
            "g",
            [oh.make_tensor_value_info("x", _F, [1])],
            [oh.make_tensor_value_info("y", _F, [1])],
        )
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
        model.ir_version = 8
        try:
            make_session(model)
            return opset
        except Exception:
            continue
    return 11


class _Builder:
    """A graph as a chain: each block reads the current value and writes the next."""

    def __init__(self, seed: int, opset: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.opset = opset
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.count = 0

    def name(self, hint: str) -> str:
        self.count += 1
        return f"{hint}{self.count}"

    def const(self, array: np.ndarray, hint: str = "w") -> str:
        name = self.name(hint)
        self.inits.append(nh.from_array(np.asarray(array), name))
        return name

    def node(self, op: str, inputs: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(oh.make_node(op, inputs, [out], name=self.name("n"), **attrs))
        return out

    def scalar(self, value: float) -> str:
        return self.const(np.array(value, np.float32), "c")

    def weights(self, *shape: int, scale: float = 0.3) -> str:
        return self.const((self.rng.standard_normal(shape) * scale).astype(np.float32))

    # image blocks, x: [N, C, H, W]
    def conv(self, x: str, channels: int, *, bias: bool) -> tuple[str, int]:
        out = int(self.rng.choice([4, 6, 8]))
        kernel = int(self.rng.choice([1, 3]))
        inputs = [x, self.weights(out, channels, kernel, kernel)]
        if bias:
            inputs.append(self.weights(out))
        pads = [kernel // 2] * 4
        return self.node("Conv", inputs, kernel_shape=[kernel, kernel], pads=pads), out

    def batch_norm(self, x: str, channels: int) -> str:
        scale = self.rng.uniform(0.5, 1.5, channels).astype(np.float32)
        bias = self.rng.uniform(-0.5, 0.5, channels).astype(np.float32)
        mean = self.rng.uniform(-0.3, 0.3, channels).astype(np.float32)
        var = self.rng.uniform(0.5, 2.0, channels).astype(np.float32)
        inputs = [x, *(self.const(a, "bn") for a in (scale, bias, mean, var))]
        return self.node("BatchNormalization", inputs, epsilon=1e-5)

    def clip6(self, x: str, low: float = 0.0, high: float = 6.0) -> str:
        if self.opset < 11:  # pragma: no cover - the fuzz starts at 11
            return self.node("Clip", [x], min=low, max=high)
        return self.node("Clip", [x, self.scalar(low), self.scalar(high)])

    def image_block(self, kind: str, x: str, channels: int) -> tuple[str, int]:
        if kind == "conv":
            return self.conv(x, channels, bias=bool(self.rng.integers(2)))
        if kind == "conv_bn":
            y, channels = self.conv(x, channels, bias=bool(self.rng.integers(2)))
            return self.batch_norm(y, channels), channels
        if kind == "bn":
            return self.batch_norm(x, channels), channels
        if kind == "hard_swish":  # x * Clip(x + 3, 0, 6) / 6
            shifted = self.node("Add", [x, self.scalar(3.0)])
            gate = self.node("Mul", [x, self.clip6(shifted)])
            return self.node("Div", [gate, self.scalar(6.0)]), channels
        if kind == "hard_sigmoid":
            return self.node("HardSigmoid", [x], alpha=1 / 6, beta=0.5), channels
        if kind == "clip6":
            return self.clip6(x), channels
        if kind == "residual":
            y = self.node("Conv", [x, self.weights(channels, channels, 1, 1)], kernel_shape=[1, 1])
            return self.node("Add", [self.node("Relu", [y]), x]), channels
        if kind == "pool":
            return self.node("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1]), channels
        return self.common(kind, x), channels

    # sequence blocks, x: [B, S, D]
    def sequence_block(self, kind: str, x: str, width: int) -> tuple[str, int]:
        if kind == "linear":
            out = int(self.rng.choice([8, 12, 16]))
            y = self.node("MatMul", [x, self.weights(width, out)])
            return self.node("Add", [y, self.weights(out)]), out
        if kind == "layer_norm":
            gamma = self.const(self.rng.uniform(0.5, 1.5, width).astype(np.float32))
            beta = self.weights(width)
            if self.opset >= 17 and self.rng.integers(2):
                return self.node("LayerNormalization", [x, gamma, beta], axis=-1), width
            mean = self.reduce_mean(x)
            centered = self.node("Sub", [x, mean])
            var = self.reduce_mean(self.node("Pow", [centered, self.scalar(2.0)]))
            std = self.node("Sqrt", [self.node("Add", [var, self.scalar(1e-5)])])
            normed = self.node("Div", [centered, std])
            return self.node("Add", [self.node("Mul", [normed, gamma]), beta]), width
        if kind == "rms_norm":
            gamma = self.const(self.rng.uniform(0.5, 1.5, width).astype(np.float32))
            if self.rng.integers(2):
                square = self.node("Mul", [x, x])
            else:
                square = self.node("Pow", [x, self.scalar(2.0)])
            mean = self.reduce_mean(square)
            rms = self.node("Sqrt", [self.node("Add", [mean, self.scalar(1e-6)])])
            inverse = self.node("Reciprocal", [rms])
            return self.node("Mul", [gamma, self.node("Mul", [x, inverse])]), width
        if kind == "gelu_erf":  # x * 0.5 * (1 + erf(x / sqrt 2))
            erf = self.node("Erf", [self.node("Div", [x, self.scalar(1.4142135)])])
            half = self.node("Mul", [x, self.scalar(0.5)])
            return self.node("Mul", [half, self.node("Add", [erf, self.scalar(1.0)])]), width
        if kind == "gelu_tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
            cube = self.node("Pow", [x, self.scalar(3.0)])
            inner = self.node("Add", [x, self.node("Mul", [cube, self.scalar(0.044715)])])
            tanh = self.node("Tanh", [self.node("Mul", [inner, self.scalar(0.7978846)])])
            one = self.node("Add", [tanh, self.scalar(1.0)])
            return self.node("Mul", [self.node("Mul", [x, self.scalar(0.5)]), one]), width
        if kind == "softmax":
            return self.node("Softmax", [x], axis=-1), width
        if kind == "reshape":  # flattened and back by its own Shape: folded where static
            flat = self.node("Reshape", [x, self.const(np.array([-1, width], np.int64), "s")])
            return self.node("Reshape", [self.node("Relu", [flat]), self.node("Shape", [x])]), width
        if kind == "residual":
            y = self.node("MatMul", [x, self.weights(width, width)])
            return self.node("Add", [x, self.node("Add", [y, self.weights(width)])]), width
        return self.common(kind, x), width

    def reduce_mean(self, x: str) -> str:
        if self.opset >= 18:
            return self.node("ReduceMean", [x, self.const(np.array([-1], np.int64), "axes")])
        return self.node("ReduceMean", [x], axes=[-1])

    def common(self, kind: str, x: str) -> str:
        if kind == "relu":
            return self.node("Relu", [x])
        if kind == "sigmoid":
            return self.node("Sigmoid", [x])
        if kind == "silu":
            return self.node("Mul", [x, self.node("Sigmoid", [x])])
        if kind == "scale":
            return self.node("Mul", [x, self.scalar(float(self.rng.uniform(0.5, 2.0)))])
        raise AssertionError(kind)


@st.composite
def graphs(draw) -> onnx.ModelProto:
    # half of them at 11-13: old opsets are where an op or attribute goes missing
    opsets = st.one_of(st.integers(11, 13), st.integers(11, newest_opset()))
    opset = draw(opsets, label="opset")
    image = draw(st.booleans(), label="image")
    dynamic = draw(st.booleans(), label="dynamic")
    seed = draw(st.integers(0, 2**31 - 1), label="seed")
    kinds = IMAGE_BLOCKS if image else SEQUENCE_BLOCKS
    blocks = draw(st.lists(st.sampled_from(kinds), min_size=1, max_size=7), label="blocks")
    b = _Builder(seed, opset)
    if image:
        width = 3
        dims: list = ["N" if dynamic else 2, width, 8, 8]
        current = "x"
        for kind in blocks:
            current, width = b.image_block(kind, current, width)
        out_dims: list = ["N" if dynamic else 2, width, 8, 8]  # every block keeps H and W
    else:
        width = 8
        dims = ["B" if dynamic else 2, "S" if dynamic else 5, width]
        current = "x"
        for kind in blocks:
            current, width = b.sequence_block(kind, current, width)
        out_dims = [dims[0], dims[1], width]
    b.nodes.append(oh.make_node("Identity", [current], ["y"], name="out"))
    graph = oh.make_graph(
        b.nodes,
        "fuzz",
        [oh.make_tensor_value_info("x", _F, dims)],
        [oh.make_tensor_value_info("y", _F, out_dims)],
        b.inits,
    )
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    model.ir_version = 8 if opset < 21 else 10
    onnx.checker.check_model(model, full_check=True)  # a failure here is the generator's
    return model


def _same_outputs(original: onnx.ModelProto, fused: onnx.ModelProto) -> None:
    dynamic = {d.dim_param for d in original.graph.input[0].type.tensor_type.shape.dim}
    for sizes in ({"N": 1, "B": 1, "S": 3}, {"N": 3, "B": 2, "S": 7}):
        dims = {name: sizes[name] for name in dynamic if name in sizes}
        feeds = random_inputs(original, seed=sum(dims.values()), dims=dims)
        want = make_session(original).run(None, feeds)
        got = make_session(fused).run(None, feeds)
        for w, g in zip(want, got, strict=True):
            np.testing.assert_allclose(g, w, **TOL)


@pytest.mark.parametrize("target", ["generic", "onnxruntime"])
@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # make test draws the same graphs each run; the corpus tier more
)
@given(model=graphs())
def test_random_graphs_come_out_verified(model: onnx.ModelProto, target: str) -> None:
    result = optimize(model, OptimizeConfig(target=target))

    assert result.rejected == [], [r.to_dict() for r in result.rejected]
    assert result.check is not None and result.check.passed, result.check.error
    fused = result.to_proto()
    if target == "generic":
        onnx.checker.check_model(fused, full_check=True)
    _same_outputs(model, fused)
