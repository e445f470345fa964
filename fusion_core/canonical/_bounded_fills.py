"""Rule ``bounded_fill``: a masked_fill of attention scores by a finite fill the scores
do not absorb (``Where(allowed, w, c)``, OpenAI GPT's ``c = -1e4`` once ``blend_mask``
has read its blend) takes the fill ``f = -1e30`` instead, where the scores are proven
small enough that the Softmax cannot tell: then ``mask_as_bias`` reads it as the
additive mask every attention rewriter takes.

What is proven, per row of the Softmax (float32 only):

* ``|w| <= W`` for every score (``score_bound``: norms of the query rows and key
  columns from the weights, Cauchy-Schwarz), with ``W + 104 < -c``;
* the Where reaches the Softmax through Adds of pads only, each pad holding 0 or a
  number of magnitude at least ``2**124`` or an infinity (``_absorbing``): a constant
  so checked, ``Mul(k, K)`` of an integer-valued ``k`` (a Cast of integers, their
  differences) and a scalar ``|K| >= 2**124`` (BERT's and GPT's ``(1 - m) * lowest``),
  a Where of such, or views of one.

Why the rows are the same: positions the condition keeps are not changed. A masked
position holds ``c + pads`` before and ``f + pads`` after; where a pad is not 0 both are
that pad's sum, as a kept score plus it is (``|c|, |f|, W < 2**100``, half an ulp of
``2**124``; sums of pads are 0 or multiples of ``2**101``, an infinity or NaN alike on
both sides). So the rows differ only at masked positions whose pads are all 0: ``c``
before, ``f`` after. Every other position holds a kept score (at least ``-W``, above
``c + 104``) or a sum of pads (0, or at least ``2**101`` in magnitude). If one of them
is above ``c + 104``, so is the row's maximum ``m``: ``exp(c - m)`` is below
``e**-104``, under half of float32's smallest subnormal, so those positions weigh 0
before, as ``exp(f - m)`` does after. Otherwise all of them are at most ``-2**101``,
below both ``c`` and ``f`` by far more than 104: they weigh 0, and the masked positions
with pads 0 share the row equally, before (all ``c``) and after (all ``f``). Where a
score could reach ``c + 104`` (``W`` too large, or unknown), the fill stays as it is.

What no fusion took is written back (``undo_bounded_fills``): each Where that still
reads a fill this rule made reads ``c`` again, and ``scores + (Where(allowed, 0, f) +
pad)`` (``mask_as_bias`` and ``one_bias`` after this rule) is ``Where(allowed, scores,
c) + pad`` again.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import INTEGER_TYPES, array_initializer, take_place
from autofusion.fusion_core.canonical._score_bounds import score_bound
from autofusion.fusion_core.ir import constant_array

__all__ = ["RULE", "bounded_fills", "undo_bounded_fills"]

RULE = "bounded_fill"
_ONNX = ("", "ai.onnx")
_FILL = np.float32(-1e30)  # what the scores absorb: mask_as_bias takes fills at most -1e30
_UNDERFLOW = 104.0  # exp(-104) is below float32's smallest subnormal (1.4e-45)
_HUGE = 2.0**124
_DEPTH = 8
_VIEWS = frozenset({"Unsqueeze", "Expand", "Reshape", "Slice", "Squeeze", "Identity"})
_WAS = "autofusion.canonical.bounded_fill.was"  # on a fill this rule made: the old fill


def bounded_fills(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Give each masked_fill of bounded scores by a small finite fill the fill -1e30;
    how many."""
    del mark  # the Where stays where it is; its new fill carries what it was
    done = 0
    for node in list(graph):
        if node.op_type != "Where" or node.domain not in _ONNX or len(node.inputs) != 3:
            continue
        out = node.outputs[0]
        if out.dtype != ir.DataType.FLOAT or out.is_graph_output() or not _to_softmax(out):
            continue
        for scores_at, fill_at in ((1, 2), (2, 1)):
            scores, fill = node.inputs[scores_at], node.inputs[fill_at]
            c = _number(fill)
            if scores is None or c is None or constant_array(scores) is not None:
                continue
            if not np.isfinite(c) or c <= _FILL or (w := score_bound(scores)) is None:
                continue
            if w + _UNDERFLOW >= -c:
                continue
            new = array_initializer(graph, fresh_name(f"{RULE}_fill"), np.array(_FILL))
            new.meta[_WAS] = fill
            node.replace_input_with(fill_at, new)
            done += 1
            break
    return done


def undo_bounded_fills(graph: ir.Graph, mark: str) -> int:
    """Put the old fill back into each masked_fill of the scores that still reads one
    this rule made, and into each additive form of one that no fusion took (``scores +
    (Where(allowed, 0, f) + pad)``, as ``mask_as_bias`` and ``one_bias`` left it: it is
    ``Where(allowed, scores, c) + pad`` again); how many."""
    del mark
    undone = 0
    for name, value in list(graph.initializers.items()):
        if value.meta.get(_WAS) is None:
            continue
        for use in list(value.uses()):
            reader = use.node
            if reader.op_type != "Where" or reader.graph is not graph:
                continue
            if _number(reader.inputs[3 - use.idx]) is None:  # Where(allowed, scores, f)
                reader.replace_input_with(use.idx, _old_fill(graph, value))
                undone += 1
            elif use.idx == 2 and _number(reader.inputs[1]) == 0.0:
                undone += _masked_fill_again(graph, reader, _old_fill(graph, value))
        if not value.uses() and not value.is_graph_output():
            graph.initializers.pop(name)
    return undone


def _old_fill(graph: ir.Graph, value: ir.Value) -> ir.Value:
    """The fill ``value`` stands for, where the graph still has it, else again."""
    old = value.meta[_WAS]
    producer = old.producer()
    if graph.initializers.get(old.name or "") is old or (
        producer is not None and producer.graph is graph
    ):
        return old
    return array_initializer(graph, old.name or f"{RULE}_old", constant_array(old))


def _masked_fill_again(graph: ir.Graph, bias: ir.Node, fill: ir.Value) -> int:
    """``Add(Where(allowed, scores, c), pad)`` in place of ``Add(scores, Add(bias,
    pad))`` (operands in either order) where ``bias`` is ``Where(allowed, 0, f)``; 1
    where so written, else 0 (a fusion took the sum, or it is spelled otherwise)."""
    summed = [use.node for use in bias.outputs[0].uses()]
    if len(summed) != 1 or summed[0].op_type != "Add" or summed[0].domain not in _ONNX:
        return 0
    pad = next((v for v in summed[0].inputs if v is not bias.outputs[0]), None)
    added = [use.node for use in summed[0].outputs[0].uses()]
    if pad is None or len(added) != 1 or added[0].op_type != "Add":
        return 0
    scores = next((v for v in added[0].inputs if v is not summed[0].outputs[0]), None)
    if scores is None or summed[0].outputs[0].is_graph_output():
        return 0
    where = ir.Node("", "Where", [bias.inputs[0], scores, fill], name=f"{bias.name}_{RULE}")
    again = ir.Node("", "Add", [where.outputs[0], pad], name=f"{added[0].name}_{RULE}")
    out = added[0].outputs[0]
    where.outputs[0].name, where.outputs[0].dtype = f"{out.name}_{RULE}", out.dtype
    where.outputs[0].shape = out.shape
    graph.insert_before(added[0], [where, again])
    take_place(out, again.outputs[0])
    again.outputs[0].dtype, again.outputs[0].shape = out.dtype, out.shape
    graph.remove([added[0], summed[0], bias], safe=True)
    return 1


def _to_softmax(value: ir.Value) -> bool:
    """Whether ``value`` reaches a Softmax through Adds of absorbing pads only."""
    for _ in range(_DEPTH):
        readers = [use.node for use in value.uses()]
        if len(readers) != 1 or readers[0].domain not in _ONNX:
            return False
        reader = readers[0]
        if reader.op_type == "Softmax":
            return True
        if reader.op_type != "Add" or len(reader.inputs) != 2:
            return False
        other = reader.inputs[1] if reader.inputs[0] is value else reader.inputs[0]
        if other is None or other is value or not _absorbing(other):
            return False
        value = reader.outputs[0]
    return False


def _absorbing(value: ir.Value, depth: int = 0) -> bool:
    """Whether every value of ``value`` is 0, at least ``2**124`` in magnitude, or
    infinite."""
    array = constant_array(value)
    if array is not None:
        return array.dtype.kind == "f" and _absorbing_values(array)
    node = value.producer()
    if node is None or node.domain not in _ONNX or depth > _DEPTH:
        return False
    if node.op_type in _VIEWS:
        return node.inputs[0] is not None and _absorbing(node.inputs[0], depth + 1)
    if node.op_type == "Where" and None not in node.inputs:
        return all(_absorbing(v, depth + 1) for v in node.inputs[1:])  # type: ignore[arg-type]
    if node.op_type == "Mul" and len(node.inputs) == 2 and None not in node.inputs:
        for k, big in (node.inputs, tuple(reversed(node.inputs))):
            factor = _number(big)
            huge = factor is not None and np.isfinite(factor) and abs(factor) >= _HUGE
            if huge and _integer_valued(k, depth + 1):  # type: ignore[arg-type]
                return True
    return False


def _absorbing_values(array: np.ndarray) -> bool:
    magnitudes = np.abs(array.astype(np.float64))
    return bool(np.all((magnitudes == 0) | (magnitudes >= _HUGE)))  # inf counts, NaN not


def _integer_valued(value: ir.Value, depth: int) -> bool:
    """Whether every value of the float ``value`` is a whole number (so 0 or at least 1
    in magnitude): a Cast of integers, differences and sums of such, views of one."""
    array = constant_array(value)
    if array is not None:
        return bool(np.all(np.isfinite(array)) and np.all(array == np.round(array)))
    node = value.producer()
    if node is None or node.domain not in _ONNX or depth > _DEPTH or None in node.inputs:
        return False
    if node.op_type == "Cast":
        return node.inputs[0].dtype in INTEGER_TYPES  # type: ignore[union-attr]
    if node.op_type in _VIEWS or node.op_type == "Neg":
        return _integer_valued(node.inputs[0], depth + 1)  # type: ignore[arg-type]
    if node.op_type in ("Sub", "Add") and len(node.inputs) == 2:
        return all(_integer_valued(v, depth + 1) for v in node.inputs)  # type: ignore[arg-type]
    return False


def _number(value: ir.Value | None) -> float | None:
    array = constant_array(value) if value is not None else None
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None
