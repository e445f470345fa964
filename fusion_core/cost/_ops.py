"""What one node costs: FLOPs and bytes moved, from inferred shapes and dtypes.

Conventions (order-of-magnitude counts for a roofline model, not cycle counts):

- A multiply-add is 2 FLOPs. MatMul: ``2 * elements(Y) * K``. Gemm: ``2 * M * N * K``
  plus ``M * N`` for the bias C (alpha and beta are not counted). Conv:
  ``2 * elements(Y) * C_in/group * prod(kernel)`` (``prod(W.shape[1:])``, so groups
  and depthwise convolutions count right) plus ``elements(Y)`` for the bias.
  ConvTranspose scatters each input element over ``C_out/group * prod(kernel)`` outputs:
  ``2 * elements(X) * prod(W.shape[1:])`` plus ``elements(Y)`` for the bias.
- Elementwise ops: FLOPs per output element from ``ELEMENTWISE_FLOPS`` (1 for
  arithmetic and comparisons; a transcendental such as Exp, Erf or Tanh costs
  ``TRANSCENDENTAL_FLOPS``, the length of the polynomial vectorised math libraries use).
- Normalizations and Softmax: FLOPs per input element from ``PER_INPUT_FLOPS`` (Softmax
  12: max, subtract, exp, sum, divide; LayerNormalization 8: mean, subtract, square,
  sum, scale by the reciprocal deviation, gamma, beta; inference BatchNormalization 2:
  ``x * s + t`` with per-channel s and t).
- Reductions: per input element (``PER_INPUT_FLOPS``); pools: ``elements(Y) *
  prod(kernel_shape)``.
- Data movement (Transpose, Concat, Slice, Gather, Cast, ...): 0 FLOPs, inputs read
  and outputs written.
- Views (Reshape, Flatten, Squeeze, Unsqueeze, Identity, Constant): onnxruntime reuses
  the input buffer for the output, so nothing is copied: 0 FLOPs and 0 bytes (still a
  kernel launch). Shape and Size read no data and are counted the same way.
  ``NodeCost.view`` marks them.
- Anything else: 1 FLOP per output element.

Bytes read are the distinct inputs (an initializer is read like any other input);
bytes written are the outputs. A dimension that is symbolic resolves through the dims
profile (``{"batch": 8}``); one that does not resolve makes the node's cost unknown.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import onnx_ir as ir

__all__ = [
    "ELEMENTWISE_FLOPS",
    "PER_INPUT_FLOPS",
    "TRANSCENDENTAL_FLOPS",
    "NodeCost",
    "Shapes",
    "node_cost",
]

TRANSCENDENTAL_FLOPS = 8


def _ops(names: str) -> list[str]:
    return names.split()


ELEMENTWISE_FLOPS: dict[str, int] = dict.fromkeys(
    _ops(
        "Add Sub Mul Div Neg Abs Relu Max Min Sum Where Clip Equal Less LessOrEqual Greater "
        "GreaterOrEqual Not And Or Xor Floor Ceil Round Sign Mod PRelu LeakyRelu "
        "ThresholdedRelu BitShift IsNaN IsInf Sqrt Reciprocal Shrink"
    ),
    1,
)
ELEMENTWISE_FLOPS.update(
    dict.fromkeys(_ops("Exp Log Erf Tanh Sin Cos Tan Asin Acos Atan"), TRANSCENDENTAL_FLOPS)
)
ELEMENTWISE_FLOPS.update(
    {
        "Pow": TRANSCENDENTAL_FLOPS,  # exp(y * log(x)): one polynomial pair, counted once
        "Sigmoid": TRANSCENDENTAL_FLOPS + 2,  # 1 / (1 + exp(-x))
        "HardSigmoid": 3,
        "HardSwish": 4,
        "Elu": TRANSCENDENTAL_FLOPS + 2,
        "Selu": TRANSCENDENTAL_FLOPS + 3,
        "Celu": TRANSCENDENTAL_FLOPS + 3,
        "Softplus": 2 * TRANSCENDENTAL_FLOPS + 1,  # log(1 + exp(x))
        "Softsign": 3,
        "Mish": 3 * TRANSCENDENTAL_FLOPS + 2,  # x * tanh(softplus(x))
        "Gelu": TRANSCENDENTAL_FLOPS + 4,  # 0.5 * x * (1 + erf(x / sqrt(2)))
        "FastGelu": TRANSCENDENTAL_FLOPS + 7,  # the tanh form, with x^3
        "BiasGelu": TRANSCENDENTAL_FLOPS + 5,
        "QuickGelu": TRANSCENDENTAL_FLOPS + 3,
    }
)

PER_INPUT_FLOPS: dict[str, int] = {
    "Softmax": 12,
    "LogSoftmax": 12,
    "Hardmax": 1,
    "LayerNormalization": 8,
    "SkipLayerNormalization": 9,  # the residual Add, then LayerNormalization
    "SimplifiedLayerNormalization": 4,  # RMS: square, sum, scale, gamma
    "SkipSimplifiedLayerNormalization": 5,
    "RMSNormalization": 4,
    "BatchNormalization": 2,
    "InstanceNormalization": 8,
    "GroupNormalization": 8,
    "ReduceSum": 1,
    "ReduceMean": 1,
    "ReduceMax": 1,
    "ReduceMin": 1,
    "ReduceProd": 1,
    "ReduceL1": 2,
    "ReduceL2": 2,
    "ReduceSumSquare": 2,
    "ReduceLogSum": 1,
    "ReduceLogSumExp": TRANSCENDENTAL_FLOPS + 1,
    "ArgMax": 1,
    "ArgMin": 1,
    "GlobalAveragePool": 1,
    "GlobalMaxPool": 1,
    "GlobalLpPool": 2,
}

DATA_MOVEMENT = frozenset(
    _ops(
        "Transpose Concat Split Slice Gather GatherElements GatherND Expand Tile Pad Cast "
        "CastLike DepthToSpace SpaceToDepth ScatterND ScatterElements ConstantOfShape Trilu"
    )
)
# No data copied: the output aliases the input, is a constant, or (Shape, Size) only
# describes it.
VIEWS = frozenset(_ops("Reshape Flatten Squeeze Unsqueeze Identity Constant Dropout Shape Size"))
_DOMAINS = ("", "ai.onnx", "com.microsoft")


@dataclass(frozen=True)
class NodeCost:
    """FLOPs and bytes of one node; ``view``: its output aliases its input (no copy)."""

    op_type: str
    flops: int
    bytes_read: int
    bytes_written: int
    view: bool = False

    @property
    def bytes(self) -> int:
        return self.bytes_read + self.bytes_written

    def to_dict(self) -> dict:
        return {
            "op_type": self.op_type,
            "flops": self.flops,
            "bytes_read": self.bytes_read,
            "bytes_written": self.bytes_written,
            "view": self.view,
        }


class Shapes:
    """Concrete shapes and sizes of values, symbolic dims resolved through ``dims``."""

    def __init__(self, dims: Mapping[str, int] | None = None) -> None:
        self.dims = dict(dims or {})

    def shape(self, value: ir.Value | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        shape = value.shape
        if shape is None and value.const_value is not None:
            shape = value.const_value.shape
        if shape is None:
            return None
        resolved = []
        for dim in shape:
            if isinstance(dim, int):
                resolved.append(dim)
                continue
            size = self._resolve(dim)
            if size is None:
                return None
            resolved.append(size)
        return tuple(resolved)

    def _resolve(self, dim: ir.SymbolicDim) -> int | None:
        if dim.value is None or not self.dims:
            return None
        try:
            size = dim.evaluate(self.dims)
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            return None
        return size if isinstance(size, int) else None

    def elements(self, value: ir.Value | None) -> int | None:
        shape = self.shape(value)
        return None if shape is None else math.prod(shape)

    def nbytes(self, value: ir.Value) -> int | None:
        """Bytes of the value's data (sub-byte types packed), None if unknown."""
        elements = self.elements(value)
        dtype = value.dtype
        if dtype is None and value.const_value is not None:
            dtype = value.const_value.dtype
        if elements is None or dtype is None:
            return None
        return math.ceil(elements * dtype.bitwidth / 8)


def node_cost(node: ir.Node, shapes: Shapes) -> NodeCost | None:
    """The node's FLOPs and bytes, or None when a shape or dtype it needs is unknown."""
    op = node.op_type
    known_domain = node.domain in _DOMAINS
    if known_domain and op in VIEWS:
        return NodeCost(op, 0, 0, 0, view=True)
    inputs = _distinct(v for v in node.inputs if v is not None)
    outputs = [v for v in node.outputs if v.name]
    read = _total(shapes.nbytes(v) for v in inputs)
    written = _total(shapes.nbytes(v) for v in outputs)
    if read is None or written is None:
        return None
    flops = _flops(node, shapes) if known_domain else shapes.elements(_first(outputs))
    if flops is None:
        return None
    return NodeCost(op, flops, read, written)


def _flops(node: ir.Node, shapes: Shapes) -> int | None:
    op = node.op_type
    rule = _RULES.get(op)
    if rule is not None:
        return rule(node, shapes)
    if op in DATA_MOVEMENT:
        return 0
    if op in PER_INPUT_FLOPS:
        elements = shapes.elements(node.inputs[0] if node.inputs else None)
        return None if elements is None else PER_INPUT_FLOPS[op] * elements
    out = shapes.elements(_first(node.outputs))
    if out is None:
        return None
    if op in ("Sum", "Max", "Min", "Mean"):  # variadic: one op per extra input
        extra = max(len([v for v in node.inputs if v is not None]) - 1, 1)
        return extra * out + (out if op == "Mean" else 0)
    return ELEMENTWISE_FLOPS.get(op, 1) * out


def _matmul(node: ir.Node, shapes: Shapes) -> int | None:
    a = shapes.shape(_input(node, 0))
    out = shapes.elements(_first(node.outputs))
    if a is None or out is None or not a:
        return None
    return 2 * out * a[-1]


def _gemm(node: ir.Node, shapes: Shapes) -> int | None:
    a = shapes.shape(_input(node, 0))
    out = shapes.elements(_first(node.outputs))
    if a is None or out is None or len(a) != 2:
        return None
    k = a[0] if node.attributes.get_int("transA", 0) else a[1]
    bias = out if _input(node, 2) is not None else 0
    return 2 * out * k + bias


def _conv(node: ir.Node, shapes: Shapes) -> int | None:
    w = shapes.shape(_input(node, 1))
    out = shapes.elements(_first(node.outputs))
    if w is None or out is None or len(w) < 2:
        return None
    bias = out if _input(node, 2) is not None else 0
    return 2 * out * math.prod(w[1:]) + bias


def _conv_transpose(node: ir.Node, shapes: Shapes) -> int | None:
    x = shapes.elements(_input(node, 0))
    w = shapes.shape(_input(node, 1))
    out = shapes.elements(_first(node.outputs))
    if x is None or w is None or out is None or len(w) < 2:
        return None
    bias = out if _input(node, 2) is not None else 0
    return 2 * x * math.prod(w[1:]) + bias


def _pool(node: ir.Node, shapes: Shapes) -> int | None:
    out = shapes.elements(_first(node.outputs))
    kernel = node.attributes.get_ints("kernel_shape")
    if out is None or not kernel:
        return None
    return out * math.prod(kernel)


_Rule = Callable[[ir.Node, Shapes], "int | None"]
_RULES: dict[str, _Rule] = {
    "MatMul": _matmul,
    "FusedMatMul": _matmul,
    "MatMulInteger": _matmul,
    "Gemm": _gemm,
    "FusedGemm": _gemm,
    "Conv": _conv,
    "FusedConv": _conv,
    "ConvInteger": _conv,
    "ConvTranspose": _conv_transpose,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "LpPool": _pool,
}


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if index < len(node.inputs) else None


def _first(values) -> ir.Value | None:
    return next(iter(values), None)


def _distinct(values) -> list[ir.Value]:
    seen: dict[int, ir.Value] = {}
    for value in values:
        seen.setdefault(id(value), value)
    return list(seen.values())


def _total(sizes) -> int | None:
    total = 0
    for size in sizes:
        if size is None:
            return None
        total += size
    return total
