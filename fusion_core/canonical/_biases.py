"""Rule ``one_bias``: the scores take one additive bias, however many the model adds.

T5 adds its relative position bias and then the mask, ``(scores + position) + mask``;
ALiBi models add their slopes and the mask the same way. The attention patterns read one
``Add(scores, bias)`` before the Softmax, so::

    Add(Add(scores, b1), b2)  ->  Add(scores, Add(b1, b2))

where one of ``b1``, ``b2`` is a mask: ``Where(c, 0, negative)`` with ``negative`` -inf
or at most -1e30, or BERT's ``(1 - Cast(m, float)) * negative`` of an integer ``m``
(0 where m is 1, else at least ``|negative|`` or infinite). That makes the regrouping
exact: where the mask is 0 both sides add the same two numbers in the same order, and
elsewhere the mask absorbs them on both sides (a score or a bias would need to exceed
1e31 to round otherwise). Two general biases
would round differently, so they stay as they are.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import INTEGER_TYPES, replace
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.ir import constant_array

__all__ = ["RULE", "biases_summed"]

RULE = "one_bias"
_ONNX = ("", "ai.onnx")
_MASKED = -1e30
_THROUGH = frozenset({"Expand", "Identity", "Slice", "Unsqueeze"})
_INTEGERS = INTEGER_TYPES


def biases_summed(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Add a mask and another bias first wherever both are added to attention scores
    one after the other; how many."""
    done = 0
    for outer in list(graph):
        found = _two_biases(outer)
        if found is None:
            continue
        scores, first, second = found
        biases = ir.Node("", "Add", [first, second], name=fresh_name(f"{RULE}_biases"))
        biases.outputs[0].name = fresh_name(f"{RULE}_bias")
        biases.outputs[0].dtype = scores.dtype
        biases.outputs[0].shape = _broadcast(first.shape, second.shape, outer.outputs[0].shape)
        added = ir.Node("", "Add", [scores, biases.outputs[0]], name=fresh_name(f"{RULE}_Add"))
        added.outputs[0].name = fresh_name(f"{RULE}_scores")
        added.outputs[0].dtype, added.outputs[0].shape = (
            outer.outputs[0].dtype,
            outer.outputs[0].shape,
        )
        inner = outer.inputs[0].producer() if _inner_at(outer) == 0 else outer.inputs[1].producer()
        replace(graph, outer, [biases, added], mark, RULE)
        if inner is not None and not inner.outputs[0].uses():
            graph.remove(inner, safe=True)
        done += 1
    return done


def _inner_at(outer: ir.Node) -> int | None:
    """Which input of ``outer`` is ``Add(scores, bias)`` read only there, or None."""
    for index, value in enumerate(outer.inputs):
        producer = value.producer() if value is not None else None
        if (
            producer is not None
            and producer.op_type == "Add"
            and producer.domain in _ONNX
            and len(value.uses()) == 1  # type: ignore[union-attr]
            and not value.is_graph_output()  # type: ignore[union-attr]
            and _scores_side(producer) is not None
        ):
            return index
    return None


def _two_biases(outer: ir.Node) -> tuple[ir.Value, ir.Value, ir.Value] | None:
    """(scores, first bias, second bias) of ``Add(Add(scores, b1), b2)`` read by a
    Softmax, with one of the biases a mask; else None."""
    if outer.op_type != "Add" or outer.domain not in _ONNX or len(outer.inputs) != 2:
        return None
    out = outer.outputs[0]
    if out.is_graph_output() or out.dtype != ir.DataType.FLOAT or not reads_into_softmax(out):
        return None
    index = _inner_at(outer)
    if index is None:
        return None
    inner = outer.inputs[index].producer()  # type: ignore[union-attr]
    second = outer.inputs[1 - index]
    side = _scores_side(inner)  # type: ignore[arg-type]
    assert side is not None
    scores, first = inner.inputs[side], inner.inputs[1 - side]  # type: ignore[union-attr]
    if first is None or second is None or scores is None:
        return None
    if not (_is_mask(first) or _is_mask(second)):
        return None
    if first.dtype != scores.dtype or second.dtype != scores.dtype:
        return None
    return scores, first, second


def _scores_side(add: ir.Node) -> int | None:
    """Which input of ``add`` is attention scores: ``Q @ K^T`` of rank 4, or it times or
    divided by a scalar constant (the scale)."""
    for index, value in enumerate(add.inputs):
        producer = value.producer() if value is not None else None
        if producer is not None and producer.op_type in ("Mul", "Div"):
            scaled, factor = producer.inputs[0], producer.inputs[1]
            if producer.op_type == "Mul" and _scalar(scaled):
                scaled, factor = factor, scaled
            if not _scalar(factor) or scaled is None:
                continue
            producer = scaled.producer()
        if (
            producer is not None
            and producer.op_type == "MatMul"
            and producer.outputs[0].shape is not None
            and len(producer.outputs[0].shape) == 4
        ):
            return index
    return None


def _scalar(value: ir.Value | None) -> bool:
    constant = constant_array(value)
    return constant is not None and constant.size == 1


def _is_mask(value: ir.Value) -> bool:
    """``Where(c, 0, negative)`` with ``negative`` -inf or at most -1e30, through the ops
    that only re-view it."""
    for _ in range(4):
        producer = value.producer()
        if producer is None or producer.domain not in _ONNX:
            return False
        if producer.op_type == "Where":
            zero, negative = (constant_array(v) for v in producer.inputs[1:3])
            return (
                zero is not None
                and negative is not None
                and bool(np.all(zero == 0))
                and bool(np.all(negative <= _MASKED))
            )
        if producer.op_type == "Mul":
            return _integer_float_mask(producer)
        if producer.op_type not in _THROUGH or producer.inputs[0] is None:
            return False
        value = producer.inputs[0]
    return False


def _integer_float_mask(mul: ir.Node) -> bool:
    """``(1 - Cast(m, float)) * negative`` of an integer (or boolean) ``m``, the Cast
    perhaps re-viewed (Unsqueeze, Expand) before the Sub: BERT's mask,
    0 where ``m`` is 1 and at least ``|negative|`` (or infinite) anywhere else, so it
    absorbs any other bias as a mask of 0 and ``negative`` would."""
    for inverted, fill in (mul.inputs, reversed(mul.inputs)):
        negative = constant_array(fill)
        sub = inverted.producer() if inverted is not None else None
        if negative is None or negative.size != 1 or not negative.item() <= _MASKED:
            continue
        if sub is None or sub.op_type != "Sub" or not _scalar(sub.inputs[0]):
            continue
        one = constant_array(sub.inputs[0])
        cast = _through_views(sub.inputs[1])
        if one is None or one.item() != 1 or cast is None or cast.op_type != "Cast":
            continue
        source = cast.inputs[0]
        if source is not None and source.dtype in _INTEGERS:
            return True
    return False


def _through_views(value: ir.Value | None) -> ir.Node | None:
    """The producer of ``value`` past the ops that only re-view it (Funnel's
    ``1 - Unsqueeze(Cast(m))``: the mask made ``[B, 1, 1, L]`` before it is inverted)."""
    for _ in range(4):
        producer = value.producer() if value is not None else None
        if producer is None or producer.op_type not in _THROUGH or producer.domain not in _ONNX:
            return producer
        value = producer.inputs[0]
    return None


def _broadcast(a: ir.Shape | None, b: ir.Shape | None, scores: ir.Shape | None) -> ir.Shape | None:
    """The shape numpy's broadcasting gives the sum of two biases of ``scores``, where
    each dimension is known.

    Where the two dimensions are not known to agree, one of them being the scores' own
    decides it: the graph adds the biases to the scores, which works only where each
    bias's dimension is 1 or the scores', so their sum's is the scores' (MPT's ALiBi,
    a table sliced to ``128 - Max(0, 128 - L)`` keys, beside a mask of ``L`` keys)."""
    if a is None or b is None:
        return None
    rank = max(len(a), len(b))
    dims_a = [1] * (rank - len(a)) + list(a)
    dims_b = [1] * (rank - len(b)) + list(b)
    like = list(scores)[-rank:] if scores is not None and len(scores) >= rank else [None] * rank
    out = []
    for x, y, s in zip(dims_a, dims_b, like, strict=True):
        if x == 1:
            out.append(y)
        elif y == 1 or x == y:
            out.append(x)
        elif s is not None and s != 1 and (x == s or y == s):
            out.append(s)
        else:
            return None  # unknown or symbolic against a different dimension
    return ir.Shape(out)
