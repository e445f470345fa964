"""What rule ``mask_guard`` reads: where a condition put a large negative into a
Softmax's input (a fill), where a condition zeroes the Softmax's output (a zeroing), and
whether two conditions are provably the same tensor.

A condition is read with its polarity, ``blocked``: True where the condition's True
entries are the masked ones (``Where(c, negative, s)``, ``Where(c, 0, P)``), False where
its False entries are (``Where(c, s, negative)``, ``Where(c, P, 0)``, ``Mul(P, Cast(c,
float))``). A ``Not`` in front of a condition is read through by flipping the polarity.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array

__all__ = ["Fill", "Zeroing", "fills", "same_value", "zeroing", "zeroing_fill"]

_ONNX = ("", "ai.onnx")
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})
_FILL = -1e30  # a float32 fill at most this underflows exp for any realistic score
_ADD_DEPTH = 3  # Adds of biases between the fill and the Softmax: scores + (bias + mask)
_SAME_DEPTH = 6
# ops whose outputs are not a function of their inputs: two of them are not the same tensor
_RANDOM = frozenset(
    {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial"}
)
_PLAIN_ATTRIBUTES = frozenset(
    {
        ir.AttributeType.INT,
        ir.AttributeType.FLOAT,
        ir.AttributeType.STRING,
        ir.AttributeType.INTS,
        ir.AttributeType.FLOATS,
        ir.AttributeType.STRINGS,
    }
)


class Fill(NamedTuple):
    """``where`` puts the constant ``negative`` into the Softmax's input where ``cond``
    (read with ``blocked``) masks; ``direct``: it is the Softmax's input itself or an
    operand of the Add that is (``add``)."""

    cond: ir.Value
    blocked: bool
    negative: ir.Value
    where: ir.Node
    add: ir.Node | None
    direct: bool

    @property
    def infinite(self) -> bool:
        return bool(np.all(np.isneginf(constant_array(self.negative))))  # type: ignore[arg-type]


class Zeroing(NamedTuple):
    """``node`` zeroes the probabilities where ``cond`` (read with ``blocked``) masks."""

    node: ir.Node
    cond: ir.Value
    blocked: bool
    product: bool  # Mul(P, Cast(allowed)): 0 * NaN stays NaN


def fills(scores: ir.Value) -> list[Fill]:
    """Every fill of ``scores`` (a Softmax's input): ``scores`` itself a Where of one side a
    fill constant, or such a Where added to it, through at most a few Adds."""
    found: list[Fill] = []
    producer = scores.producer()
    if producer is None or producer.domain not in _ONNX:
        return found
    if producer.op_type == "Where":
        fill = _fill_of(producer, None, direct=True)
        found += [fill] if fill is not None else []
    elif producer.op_type == "Add":
        _added_fills(producer, found, 0)
    return found


def _added_fills(add: ir.Node, found: list[Fill], depth: int) -> None:
    for operand in add.inputs:
        producer = operand.producer() if operand is not None else None
        if producer is None or producer.domain not in _ONNX:
            continue
        if producer.op_type == "Where":
            fill = _fill_of(producer, add, direct=depth == 0)
            found += [fill] if fill is not None else []
        elif producer.op_type == "Add" and depth + 1 < _ADD_DEPTH:
            _added_fills(producer, found, depth + 1)


def _fill_of(where: ir.Node, add: ir.Node | None, *, direct: bool) -> Fill | None:
    """The fill ``where`` makes: one side a constant of one entry, -inf or at most the
    fill bar of its type, the other side anything else."""
    cond, first, second = where.inputs
    if cond is None or first is None or second is None:
        return None
    low = [_is_fill(v) for v in (first, second)]
    if low[0] == low[1]:
        return None
    negative = first if low[0] else second
    cond, blocked = plain(cond, low[0])
    return Fill(cond, blocked, negative, where, add, direct)


def _is_fill(value: ir.Value) -> bool:
    array = constant_array(value)
    if array is None or array.size != 1 or value.dtype not in _FLOATS:
        return False
    bar = max(_FILL, float(np.finfo(array.dtype).min))  # float16: its lowest, -65504
    entry = float(array.reshape(-1)[0])
    return entry == -np.inf or entry <= bar


def zeroing(node: ir.Node, probabilities: ir.Value) -> Zeroing | None:
    """How ``node``, a reader of ``probabilities``, zeroes them under a condition:
    ``Where(c, 0, P)``, ``Where(c, P, 0)`` or ``Mul(P, Cast(c, float))`` of a boolean
    ``c``; None when it does not."""
    if node.domain not in _ONNX or node.outputs[0].is_graph_output():
        return None
    if node.op_type == "Where" and len(node.inputs) == 3 and node.inputs[0] is not None:
        cond, first, second = node.inputs
        for side, zero, blocked in ((second, first, True), (first, second, False)):
            if side is probabilities and _is_zero(zero, probabilities):
                return Zeroing(node, *plain(cond, blocked), product=False)  # type: ignore[arg-type]
        return None
    if node.op_type != "Mul" or len(node.inputs) != 2:
        return None
    other = node.inputs[1] if node.inputs[0] is probabilities else node.inputs[0]
    cast = other.producer() if other is not None else None
    if cast is None or cast.op_type != "Cast" or cast.domain not in _ONNX or other is probabilities:
        return None
    source = cast.inputs[0]
    if source is None or source.dtype != ir.DataType.BOOL or other.dtype != probabilities.dtype:  # type: ignore[union-attr]
        return None
    return Zeroing(node, *plain(source, False), product=True)


def _is_zero(value: ir.Value | None, probabilities: ir.Value) -> bool:
    """A constant 0 of one entry whose rank does not widen the probabilities."""
    array = constant_array(value)
    if array is None or array.size != 1 or float(array.reshape(-1)[0]) != 0.0:
        return False
    rank = len(probabilities.shape) if probabilities.shape is not None else 0
    return array.ndim <= rank


def zeroing_fill(found: Zeroing, scores: ir.Value) -> Fill | None:
    """The fill of ``scores`` whose condition is ``found``'s, read alike."""
    for fill in fills(scores):
        if fill.blocked == found.blocked and same_value(fill.cond, found.cond):
            return fill
    return None


def plain(cond: ir.Value, blocked: bool) -> tuple[ir.Value, bool]:
    """``cond`` with the Nots in front of it read through (each flips ``blocked``)."""
    for _ in range(_SAME_DEPTH):
        producer = cond.producer()
        if producer is None or producer.op_type != "Not" or producer.domain not in _ONNX:
            break
        if producer.inputs[0] is None:
            break
        cond, blocked = producer.inputs[0], not blocked
    return cond, blocked


def same_value(a: ir.Value | None, b: ir.Value | None, depth: int = _SAME_DEPTH) -> bool:
    """Whether ``a`` and ``b`` are provably the same tensor: the same value, equal
    constants, or the same output of two nodes of one deterministic ONNX op with equal
    attributes over inputs that are the same (an exporter computing a mask twice)."""
    if a is b:
        return a is not None
    if a is None or b is None or depth == 0:
        return False
    left, right = constant_array(a), constant_array(b)
    if left is not None or right is not None:
        return (
            left is not None
            and right is not None
            and left.dtype == right.dtype
            and left.shape == right.shape
            and bool(np.array_equal(left, right))
        )
    pa, pb = a.producer(), b.producer()
    if pa is None or pb is None or pa.domain not in _ONNX or pb.domain not in _ONNX:
        return False
    if pa.op_type != pb.op_type or pa.op_type in _RANDOM or a.index() != b.index():
        return False
    if len(pa.inputs) != len(pb.inputs) or not _same_attributes(pa, pb):
        return False
    return all(
        same_value(x, y, depth - 1) if x is not None or y is not None else True
        for x, y in zip(pa.inputs, pb.inputs, strict=True)
    )


def _same_attributes(a: ir.Node, b: ir.Node) -> bool:
    if set(a.attributes) != set(b.attributes):
        return False
    for name, attr in a.attributes.items():
        other = b.attributes[name]
        if attr.type not in _PLAIN_ATTRIBUTES or attr.type != other.type:
            return False
        if list(np.atleast_1d(attr.value)) != list(np.atleast_1d(other.value)):
            return False
    return True
