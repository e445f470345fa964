"""Reading a normalization block in any of its spellings, for ``norm_spelling``.

An RMS norm of ``d`` (a LayerNorm is the RMS norm of ``d = x - mean(x)``) computes
``d / sqrt(mean(d^2) + eps)``. Exporters and families write each step in one of
several ways, all the same value:

* the square: ``Pow(d, 2)`` or ``Mul(d, d)``;
* a mean: ``ReduceMean(t)``, or ``ReduceSum(t)`` divided by the number of elements it
  adds (``Div(s, N)`` or ``Mul(s, 1 / N)``); or no mean at all, an L2 norm's sum of
  squares over the last axis (``SumSquares``: ``N`` times the mean);
* epsilon: ``Add(v, eps)`` either way round, or none (Helium's 1e-8, which the dynamo
  exporter leaves out): ``eps = 0``;
* the inverse root: ``Div(d, Sqrt(u))``, ``Mul(d, Reciprocal(Sqrt(u)))``,
  ``Mul(d, Div(1, Sqrt(u)))`` (torch.rsqrt through TorchScript) or
  ``Mul(d, Pow(u, -0.5))`` (Gemma-4), the Mul either way round;
* a LayerNorm's centering: ``Sub(x, m)`` or ``Add(x, Neg(m))``, ``m`` a mean of ``x``.

``read_block`` finds the parts from the square. It proves that the product scales the
same ``d`` that was squared and that each value between them has that one reader, so
rewriting a part changes nothing else the graph computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.sizes import known_dims

__all__ = [
    "NormBlock",
    "SumMean",
    "SumSquares",
    "centering",
    "read_block",
    "reduced_axes",
    "scalar_constant",
    "subtracted_mean",
]

_ONNX = ("", "ai.onnx")
_MEAN_TOLERANCE = 1e-6  # a float32 1 / N is this close to 1 / N, relatively


@dataclass(frozen=True)
class SumMean:
    """``Div(ReduceSum(t), N)`` or ``Mul(ReduceSum(t), 1 / N)``: the mean of ``t``."""

    reduce: ir.Node
    scale: ir.Node  # the Div or the Mul


@dataclass(frozen=True)
class SumSquares:
    """``ReduceSum(t)`` over the last axis and nothing divides it: an L2 norm's sum of
    squares, ``count`` times their mean."""

    reduce: ir.Node
    count: int


@dataclass(frozen=True)
class NormBlock:
    """The parts of one block, each as the graph spells it."""

    d: ir.Value
    square: ir.Node  # Pow(d, 2) or Mul(d, d)
    mean: ir.Node | SumMean | SumSquares  # of the squares (the sum, for an L2 norm)
    epsilon: ir.Node | None  # Add(v, eps); None when the graph adds none
    root: ir.Node  # Sqrt(u), or Pow(u, -0.5)
    inverse: ir.Node | None  # Reciprocal(s) or Div(1, s); None for Div(d, s) and Pow
    product: ir.Node  # Mul(d, r) or Div(d, s)

    @property
    def variance(self) -> ir.Value:
        return last_of(self.mean).outputs[0]


def last_of(mean: ir.Node | SumMean | SumSquares) -> ir.Node:
    """The node whose output is the mean (the sum, for an L2 norm)."""
    if isinstance(mean, SumSquares):
        return mean.reduce
    return mean.scale if isinstance(mean, SumMean) else mean


def _op(node: ir.Node | None, *ops: str) -> ir.Node | None:
    """``node`` when it is an ONNX-domain node of one of ``ops``."""
    return node if node is not None and node.op_type in ops and node.domain in _ONNX else None


def _producer(value: ir.Value | None, *ops: str) -> ir.Node | None:
    return _op(value.producer(), *ops) if value is not None else None


def _only_reader(value: ir.Value, *ops: str) -> ir.Node | None:
    """The one node (of ``ops``, when given) reading ``value``, when nothing else does."""
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return _op(uses[0].node, *ops) if ops else uses[0].node


def scalar_constant(value: ir.Value | None) -> float | None:
    array = constant_array(value)
    if array is None or array.size != 1 or array.dtype.kind not in "fiu":
        return None
    return float(array.reshape(-1)[0])


def _other(node: ir.Node, value: ir.Value) -> ir.Value | None:
    """The other input of a binary ``node`` one of whose inputs is ``value``."""
    if len(node.inputs) != 2:
        return None
    first, second = node.inputs
    if first is value:
        return second
    return first if second is value else None


def reduced_axes(node: ir.Node) -> list[int] | None:
    """The axes a Reduce* node names (its attribute, or its constant input 1); None when
    unknown or none (all axes, or no op with ``noop_with_empty_axes``)."""
    attr = node.attributes.get("axes")
    if attr is not None:
        return [int(a) for a in attr.value]
    array = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if array is None or array.size == 0:
        return None
    return [int(a) for a in array.reshape(-1)]


def _sum_mean(value: ir.Value | None) -> SumMean | None:
    """``value`` as ``ReduceSum(t, axes) / N``, ``N`` the elements each sum adds."""
    scale = _producer(value, "Div", "Mul")
    if scale is None or len(scale.inputs) != 2:
        return None
    reduce, factor = _producer(scale.inputs[0], "ReduceSum"), 1
    if reduce is None and scale.op_type == "Mul":
        reduce, factor = _producer(scale.inputs[1], "ReduceSum"), 0
    count = _reduced_count(reduce) if reduce is not None else None
    if count is None or _only_reader(reduce.outputs[0]) is not scale:  # type: ignore[union-attr]
        return None
    found = scalar_constant(scale.inputs[factor])
    expected = float(count) if scale.op_type == "Div" else 1.0 / count
    if found is None or abs(found - expected) > _MEAN_TOLERANCE * expected:
        return None
    return SumMean(reduce, scale)  # type: ignore[arg-type]


def _reduced_count(reduce: ir.Node) -> int | None:
    """How many elements each sum of ``reduce`` adds, where the shapes fix it."""
    axes, dims = reduced_axes(reduce), known_dims(reduce.inputs[0])
    if axes is None or dims is None or not all(-len(dims) <= a < len(dims) for a in axes):
        return None
    picked = [dims[a % len(dims)] for a in axes]
    if not all(isinstance(d, int) for d in picked):
        return None
    return int(np.prod(picked))  # type: ignore[arg-type]


def _mean_of(value: ir.Value | None, source: ir.Value) -> ir.Node | SumMean | None:
    """The mean of ``source`` that ``value`` is, in either spelling."""
    reduce = _producer(value, "ReduceMean")
    if reduce is not None and reduce.inputs[0] is source:
        return reduce
    found = _sum_mean(value)
    return found if found is not None and found.reduce.inputs[0] is source else None


def _squared(square: ir.Node) -> ir.Value | None:
    """``d`` when ``square`` is ``Pow(d, 2)`` or ``Mul(d, d)``; also for a Pow by another
    constant, so that the pattern reads the block and its near miss names the exponent
    (the rewrites are the same value whatever it is)."""
    if len(square.inputs) != 2 or square.domain not in _ONNX:
        return None
    if square.op_type == "Pow" and scalar_constant(square.inputs[1]) is not None:
        return square.inputs[0]
    if square.op_type == "Mul" and square.inputs[0] is square.inputs[1]:
        return square.inputs[0]
    return None


def read_block(square: ir.Node) -> NormBlock | None:
    """The block whose square is ``square``, or None where it is none."""
    d = _squared(square)
    reader = _only_reader(square.outputs[0], "ReduceMean", "ReduceSum") if d else None
    if d is None or reader is None:
        return None
    mean = _mean_of(reader.outputs[0], square.outputs[0])
    if mean is None and reader.op_type == "ReduceSum":
        scale = _only_reader(reader.outputs[0], "Div", "Mul")
        mean = _mean_of(scale.outputs[0], square.outputs[0]) if scale is not None else None
        if mean is None and scale is None:
            mean = _sum_of_squares(reader)
    if mean is None:
        return None
    return _tail(d, square, mean)


def _sum_of_squares(reduce: ir.Node) -> SumSquares | None:
    """``reduce`` as an L2 norm's sum over the last axis, whose size the shapes fix."""
    dims, axes = known_dims(reduce.inputs[0]), reduced_axes(reduce)
    if dims is None or axes is None or len(axes) != 1 or axes[0] % len(dims) != len(dims) - 1:
        return None
    keep = reduce.attributes.get("keepdims")
    if keep is not None and keep.value == 0:
        return None
    count = dims[-1]
    return SumSquares(reduce, count) if isinstance(count, int) and count > 0 else None


def _tail(d: ir.Value, square: ir.Node, mean: ir.Node | SumMean | SumSquares) -> NormBlock | None:
    """The rest of the block after the variance: epsilon, the root, its inverse and
    the product with ``d``."""
    u = last_of(mean).outputs[0]
    epsilon = _only_reader(u, "Add")  # whatever it adds: the pattern says what it needs
    if epsilon is not None:
        if _other(epsilon, u) is None:
            return None
        u = epsilon.outputs[0]
    root = _only_reader(u, "Sqrt", "Pow")
    if root is None or root.inputs[0] is not u:
        return None
    if root.op_type == "Pow":
        if scalar_constant(root.inputs[1]) != -0.5:
            return None
        return _checked(d, [square, mean, epsilon, root, None], root.outputs[0])
    reader = _only_reader(root.outputs[0], "Div", "Reciprocal")
    if reader is None:
        return None
    if reader.op_type == "Div" and reader.inputs[0] is d and reader.inputs[1] is root.outputs[0]:
        return NormBlock(d, square, mean, epsilon, root, None, reader)
    if reader.op_type == "Div" and (
        reader.inputs[1] is not root.outputs[0] or scalar_constant(reader.inputs[0]) != 1
    ):
        return None
    return _checked(d, [square, mean, epsilon, root, reader], reader.outputs[0])


def _checked(d: ir.Value, parts: list, inverse: ir.Value) -> NormBlock | None:
    """The block of ``parts`` when ``inverse`` is read by one ``Mul`` with ``d``."""
    product = _only_reader(inverse, "Mul")
    if product is None or _other(product, inverse) is not d:
        return None
    return NormBlock(d, *parts, product)


def centering(d: ir.Value) -> tuple[ir.Node, ir.Node, ir.Node | SumMean] | None:
    """``d = Add(x, Neg(m))`` (either way round) with ``m`` a mean of ``x``: the Add, the
    Neg and the mean."""
    add = _producer(d, "Add")
    if add is None or len(add.inputs) != 2:
        return None
    for x, negated in (add.inputs, add.inputs[::-1]):
        neg = _producer(negated, "Neg")
        mean = _mean_of(neg.inputs[0], x) if neg is not None and x is not None else None
        if mean is not None:
            return add, neg, mean  # type: ignore[return-value]
    return None


def subtracted_mean(d: ir.Value) -> SumMean | None:
    """``ReduceSum(x) / N`` when ``d = Sub(x, ReduceSum(x) / N)``."""
    sub = _producer(d, "Sub")
    if sub is None or len(sub.inputs) != 2 or sub.inputs[0] is None:
        return None
    found = _sum_mean(sub.inputs[1])
    return found if found is not None and found.reduce.inputs[0] is sub.inputs[0] else None
