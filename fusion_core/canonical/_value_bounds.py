"""How large every element of a value can be, proven from the graph: ``value_bound``,
beside ``_score_bounds``'s norms of vectors, which read it where a vector is bounded
element by element only (Funnel's sinusoid positions, its ``cls`` mask, its token-type
scores) and give it a MatMul's elements (``product``: the norms of A's rows and B's
columns), so that the two recurse into each other without importing each other.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array

__all__ = ["value_bound"]

_ONNX = ("", "ai.onnx")
_DEPTH = 40
_ROUNDING = 1.05  # as _score_bounds: what float32 arithmetic adds to a sum or product


# value_bound: the ops whose every output element is an element of input 0 (or of one
# of their inputs, Concat), so the largest magnitude carries over
_COPIES = frozenset(
    {"Identity", "Reshape", "Slice", "Split", "Transpose", "Expand", "Unsqueeze", "Squeeze"}
)
_AT_MOST_ONE = frozenset({"Sin", "Cos", "Tanh", "Sigmoid", "Softmax"})


Product = Callable[[ir.Node], float | None]  # a bound on a MatMul's elements


def value_bound(value: ir.Value, depth: int = 0, product: Product | None = None) -> float | None:
    """A proven bound on ``|x|`` for every element ``x`` of ``value``, else None:

    * a constant: its largest magnitude; ``Sin``, ``Cos``, ``Tanh``, ``Sigmoid``,
      ``Softmax``: 1;
    * the ops that copy elements (views, ``Gather`` of its data, ``Concat``): the
      largest of their sources'; ``Where``: the larger of its two branches';
    * ``Add``/``Sub``: the sum of the operands' bounds; ``Mul``: the product; ``Neg``:
      the same; a ``Cast`` to float of a bounded value: the same;
    * ``MatMul``: ``product(node)`` where given (``_score_bounds.element_bound`` gives
      Cauchy-Schwarz on the norms of A's rows and B's columns), else no bound.

    Each float32 op rounds its exact result by at most half an ulp, which can carry it
    past the bound by 2**-24 of it: the sums and products of bounds are multiplied by
    ``_ROUNDING`` where they are formed."""
    array = constant_array(value)
    if array is not None:
        if array.dtype.kind not in "fiub" or not np.isfinite(array).all():
            return None
        return float(np.max(np.abs(array.astype(np.float64)))) if array.size else 0.0
    node = value.producer()
    if node is None or node.domain not in _ONNX or depth > _DEPTH or not node.inputs:
        return None
    op = node.op_type
    if op in _AT_MOST_ONE:
        return 1.0
    if op == "ConstantOfShape":
        filled = node.attributes.get("value")
        return 0.0 if filled is None else _filled(filled.value)  # the default fill: 0
    if op == "Cast" and value.dtype not in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
        return None  # float16 would overflow past 65504
    if op == "MatMul":
        return product(node) if product is not None else None
    found = _sources(node)
    if found is None:
        return None
    sources, combined = found
    parts = [value_bound(v, depth + 1, product) if v is not None else None for v in sources]
    if not parts or any(p is None for p in parts):
        return None
    if combined == "max":
        return max(parts)  # type: ignore[type-var]
    if len(parts) != 2:
        return None
    a, b = parts
    return (a + b if combined == "sum" else a * b) * _ROUNDING  # type: ignore[operator]


def _sources(node: ir.Node) -> tuple[list[ir.Value | None], str] | None:
    """The inputs whose bounds bound ``node``'s elements, and how: ``max`` (each element
    is one of theirs), ``sum`` or ``product``; None for an op not listed."""
    op, inputs = node.op_type, list(node.inputs)
    if op in _COPIES or op in ("Gather", "GatherElements", "GatherND", "Neg", "Cast"):
        return inputs[:1], "max"
    if op == "Pad":  # the input's elements and the constant padding (0 where not given)
        return [inputs[0], *(inputs[2:3] if len(inputs) > 2 else [])], "max"
    if op in ("ScatterND", "ScatterElements") and len(inputs) == 3:
        reduction = node.attributes.get("reduction")
        if reduction is not None and reduction.value != "none":
            return None  # updates summed or multiplied in: not copies
        return [inputs[0], inputs[2]], "max"  # each element the data's or an update's
    if op in ("Where", "Concat"):
        return (inputs[1:] if op == "Where" else inputs), "max"
    if op in ("Add", "Sub"):
        return inputs, "sum"
    return (inputs, "product") if op == "Mul" else None


def _filled(tensor) -> float | None:
    """ConstantOfShape's ``value``: its one element's magnitude."""
    array = tensor.numpy()
    return float(np.max(np.abs(array))) if np.isfinite(array).all() else None
