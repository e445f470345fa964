"""Folding a per-channel affine map ``y = s * x + t`` into the op that produces ``x``.

BatchNormalization in inference is such a map
(https://onnx.ai/onnx/operators/onnx__BatchNormalization.html)::

    y = gamma * (x - mean) / sqrt(var + eps) + beta
    s = gamma / sqrt(var + eps)          t = beta - mean * s

and so are a constant per-channel Mul, Div, Add or Sub. For a producer
``x = W * X + b`` with one output channel per row of W::

    W' = W * s   (scaled along the output-channel axis)      b' = b * s + t

Output channels sit on axis 0 of a Conv weight ``[M, C/g, k...]``
(https://onnx.ai/onnx/operators/onnx__Conv.html), on axis 1 of each group of a
ConvTranspose weight ``[C, M/g, k...]`` (channel ``m = group * M/g + j``,
https://onnx.ai/onnx/operators/onnx__ConvTranspose.html), and on the N axis of a Gemm
or MatMul weight. Gemm computes ``alpha * A' B' + beta * C``
(https://onnx.ai/onnx/operators/onnx__Gemm.html), so its folded bias is
``C' = beta * C * s + t`` with ``beta`` reset to 1. Arithmetic runs in float64 and the
result is cast back to the weight's dtype.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.rewriters._base import RewriteContext, copy_attributes

__all__ = [
    "FOLDABLE_PRODUCERS",
    "Folded",
    "batchnorm_scale_shift",
    "fold_into_producer",
    "per_channel",
]

FOLDABLE_PRODUCERS = ("Conv", "ConvTranspose", "Gemm", "MatMul")


@dataclass
class Folded:
    """A producer with folded weights, not yet a node.

    Building an ``ir.Node`` registers it as a user of its inputs, so callers build only
    the node they will actually insert.
    """

    op_type: str
    inputs: list[ir.Value | None]
    attributes: list[ir.Attr]
    name: str | None

    def build(
        self, domain: str = "", op_type: str | None = None, extra: list | None = None
    ) -> ir.Node:
        return ir.Node(
            domain,
            op_type or self.op_type,
            self.inputs,
            self.attributes + (extra or []),
            name=self.name,
        )


def batchnorm_scale_shift(bn: ir.Node) -> tuple[np.ndarray, np.ndarray] | str:
    """``(s, t)`` with ``BN(x) = s * x + t`` per channel, or why not."""
    arrays = [constant_array(bn.inputs[i]) if i < len(bn.inputs) else None for i in (1, 2, 3, 4)]
    if any(a is None for a in arrays):
        return f"the parameters of BatchNormalization {bn.name!r} are not all constant"
    gamma, beta, mean, var = (a.astype(np.float64).reshape(-1) for a in arrays)
    eps = float(attribute_value(bn, "epsilon", 1e-5))
    scale = gamma / np.sqrt(var + eps)
    return scale, beta - mean * scale


def per_channel(array: np.ndarray, channels: int) -> np.ndarray | None:
    """A scalar or per-channel constant as a vector of ``channels`` values, else None."""
    flat = np.asarray(array, dtype=np.float64).reshape(-1)
    if flat.size == 1:
        return np.full(channels, flat[0])
    return flat if flat.size == channels else None


def fold_into_producer(
    producer: ir.Node, scale: np.ndarray, shift: np.ndarray, ctx: RewriteContext
) -> Folded | str:
    """The producer computing ``scale * producer(x) + shift``, or why it cannot.

    It reads the producer's data input and fresh initializers; the caller builds it and
    replaces the affine op's output with its output.
    """
    weight = constant_array(producer.inputs[1]) if len(producer.inputs) > 1 else None
    if weight is None:
        return f"the weight of {producer.op_type} {producer.name!r} is not a constant"
    channels = _output_channels(producer, weight)
    if isinstance(channels, str):
        return channels
    scale, shift = per_channel(scale, channels), per_channel(shift, channels)
    if scale is None or shift is None:
        return f"the affine map does not have one value per output channel ({channels})"
    if producer.op_type == "Gemm":
        return _fold_gemm(producer, weight, scale, shift, ctx)
    new_weight = _scale_weight(producer, weight, scale)
    old_bias = _bias(producer, channels)
    new_bias = old_bias * scale + shift
    weight_value = ctx.initializer(f"{_hint(producer, 1)}_folded", new_weight.astype(weight.dtype))
    bias_value = ctx.initializer(
        f"{producer.name or 'node'}_bias_folded", new_bias.astype(weight.dtype)
    )
    if producer.op_type == "MatMul":
        # x @ W + b as one Gemm; the pattern guarantees a rank-2 input.
        op_type, attributes = "Gemm", []
    else:
        op_type, attributes = producer.op_type, copy_attributes(producer)
    return Folded(
        op_type, [producer.inputs[0], weight_value, bias_value], attributes, producer.name
    )


def _hint(node: ir.Node, index: int) -> str:
    value = node.inputs[index]
    return value.name if value is not None and value.name else f"{node.name}_in{index}"


def _output_channels(producer: ir.Node, weight: np.ndarray) -> int | str:
    op = producer.op_type
    if op == "Conv":
        return weight.shape[0]
    if op == "ConvTranspose":
        return weight.shape[1] * int(attribute_value(producer, "group", 1))
    if op == "MatMul":
        if weight.ndim != 2:
            return f"the MatMul weight of {producer.name!r} has rank {weight.ndim}, expected 2"
        return weight.shape[1]
    if op == "Gemm":
        trans_b = int(attribute_value(producer, "transB", 0))
        return weight.shape[0] if trans_b else weight.shape[1]
    return f"cannot fold into {op} {producer.name!r}: supported are {FOLDABLE_PRODUCERS}"


def _scale_weight(producer: ir.Node, weight: np.ndarray, scale: np.ndarray) -> np.ndarray:
    w = weight.astype(np.float64)
    if producer.op_type == "Conv":
        return w * scale.reshape((-1,) + (1,) * (w.ndim - 1))
    if producer.op_type == "ConvTranspose":
        group = int(attribute_value(producer, "group", 1))
        c_in, per_group = w.shape[0], w.shape[1]
        grouped = w.reshape((group, c_in // group, per_group) + w.shape[2:])
        s = scale.reshape((group, 1, per_group) + (1,) * (w.ndim - 2))
        return (grouped * s).reshape(w.shape)
    return w * scale.reshape(1, -1)  # MatMul: [K, N]


def _bias(producer: ir.Node, channels: int) -> np.ndarray:
    bias = constant_array(producer.inputs[2]) if len(producer.inputs) > 2 else None
    if bias is None:
        return np.zeros(channels)
    return bias.astype(np.float64).reshape(-1)


def _fold_gemm(
    gemm: ir.Node, weight: np.ndarray, scale: np.ndarray, shift: np.ndarray, ctx: RewriteContext
) -> Folded | str:
    trans_b = int(attribute_value(gemm, "transB", 0))
    beta = float(attribute_value(gemm, "beta", 1.0))
    w = weight.astype(np.float64)
    new_weight = w * (scale.reshape(-1, 1) if trans_b else scale.reshape(1, -1))
    bias_value = gemm.inputs[2] if len(gemm.inputs) > 2 else None
    if bias_value is not None and constant_array(bias_value) is None:
        return f"the bias C of Gemm {gemm.name!r} is not a constant"
    bias = constant_array(bias_value)
    bias = np.zeros(1) if bias is None else bias.astype(np.float64)
    # Unidirectional broadcasting: C is [N], [1, N], [M, N] or a scalar; keep its rank.
    new_bias = beta * bias * scale + shift
    if new_bias.ndim == 0:
        new_bias = new_bias.reshape(1)
    weight_value = ctx.initializer(f"{_hint(gemm, 1)}_folded", new_weight.astype(weight.dtype))
    bias_out = ctx.initializer(f"{gemm.name or 'gemm'}_bias_folded", new_bias.astype(weight.dtype))
    attributes = copy_attributes(gemm, drop=("beta",))
    return Folded("Gemm", [gemm.inputs[0], weight_value, bias_out], attributes, gemm.name)
