"""Rule ``mask_as_bias``: an attention mask, however it is applied to the scores, is
the additive bias ``Add(scores, Where(allowed, 0, negative))`` the attention rewriters
read and prove (causal, padding, what a fully masked row gives).

The spellings brought to it, each only where its value reaches a Softmax:

* ``Where(blocked, negative, 0)``: the condition negated, ``Where(allowed, 0,
  negative)``; ``allowed`` is written without a Not where one can be taken away
  (``Not(Not(x))``, a comparison of integers flipped, an Or by De Morgan, ``x == 0``
  of an integer mask as ``Cast(x, bool)``);
* ``Mul(Sub(1, Cast(allowed, float)), negative)`` (the float mask ``(1 - m) * lowest``
  of a boolean ``m``) and transformers' older ``Where(Cast(inverted, bool), negative,
  inverted)`` of ``inverted = 1 - Cast(m, float)``: ``Where(m, 0, negative)``, exact for a
  finite ``negative`` (``0 * -inf`` is NaN, so those stay);
* masked_fill of the scores themselves, ``Where(allowed, scores, negative)`` (GPT-2,
  GPT-J and Falcon's eager attention) or ``Where(blocked, negative, scores)``:
  ``Add(scores, Where(allowed, 0, negative))``, for a ``negative`` of -inf or at most
  -1e30 (float32's lowest), where ``scores + negative`` is ``negative`` again (the
  scores would need to exceed 1e31 to round otherwise) and a fully masked row softmaxes
  to the same uniform or NaN row.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread, put_back, replace
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value

__all__ = ["CLAMP", "RULE", "clamps_dropped", "masks_as_bias", "undo_fills"]

RULE = "mask_as_bias"
CLAMP = "mask_clamp"
_LOWEST = float(np.finfo(np.float32).min)
_ONNX = ("", "ai.onnx")
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})
_INTEGERS = frozenset(
    {ir.DataType.INT64, ir.DataType.INT32, ir.DataType.INT16, ir.DataType.INT8, ir.DataType.UINT8}
)
_FLIPPED = {
    "Greater": "LessOrEqual",
    "LessOrEqual": "Greater",
    "Less": "GreaterOrEqual",
    "GreaterOrEqual": "Less",
}
_FILLED = "autofusion.canonical.masked_fill"  # an Add that was a masked_fill, to put back
_FILL = -1e30  # masked_fill by a value at most this is absorbed by any realistic score
_DEPTH = 8


def masks_as_bias(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Rewrite every mask read by a Softmax into ``Where(allowed, 0, negative)`` added to
    the scores; how many."""
    done = 0
    for node in list(graph):
        if node.domain not in _ONNX or node.op_type not in ("Where", "Mul"):
            continue
        out = node.outputs[0]
        if out.is_graph_output() or out.dtype not in _FLOATS or not reads_into_softmax(out):
            continue
        if node.op_type == "Where":
            new = _as_bias(node, fresh_name)
        else:
            new = _float_mask(node, fresh_name)
        if not new:
            continue
        for made in new:
            made.name = made.name or fresh_name(f"{RULE}_{made.op_type}")
            if made.outputs[0].name is None:
                made.outputs[0].name = fresh_name(f"{RULE}_{made.op_type.lower()}")
        new[-1].outputs[0].dtype, new[-1].outputs[0].shape = out.dtype, out.shape
        producers = [v.producer() for v in node.inputs if v is not None]
        replace(graph, node, new, mark, RULE)
        drop_unread(graph, producers)
        done += 1
    return done


def clamps_dropped(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Bypass every ``Max(scores + mask, lowest)`` whose mask is finite; how many.

    XGLM clamps its masked scores at float32's lowest so that -inf never reaches the
    Softmax. Every finite float32 is at least that, and scores plus a finite mask
    ``Where(c, 0, negative)`` are finite, so the Max returns its input unchanged."""
    del fresh_name, mark  # it inserts nothing
    done = 0
    for node in list(graph):
        if node.op_type != "Max" or node.domain not in _ONNX or len(node.inputs) != 2:
            continue
        out = node.outputs[0]
        if out.is_graph_output() or out.dtype != ir.DataType.FLOAT or not reads_into_softmax(out):
            continue
        for value, bound in (node.inputs, reversed(node.inputs)):
            lowest = constant_array(bound)
            if lowest is None or lowest.size != 1 or float(lowest.item()) != _LOWEST:
                continue
            if value is not None and _finite_masked(value):
                out.replace_all_uses_with(value)
                graph.remove(node, safe=True)
                done += 1
                break
    return done


def _finite_masked(value: ir.Value) -> bool:
    """Whether ``value`` is ``Add(scores, Where(c, 0, negative))`` with finite constants."""
    add = value.producer()
    if add is None or add.op_type != "Add" or add.domain not in _ONNX:
        return False
    for bias in add.inputs:
        where = bias.producer() if bias is not None else None
        if where is None or where.op_type != "Where":
            continue
        zero, negative = (constant_array(v) for v in where.inputs[1:3])
        if zero is None or negative is None:
            continue
        if np.all(zero == 0) and np.all(np.isfinite(negative)):
            return True
    return False


def undo_fills(graph: ir.Graph, mark: str) -> int:
    """Put back as ``Where(allowed, scores, negative)`` every masked_fill this rule made
    an added bias of where no fusion took the Add; how many."""
    undone = 0
    for added in [
        n for n in graph if n.metadata_props.get(mark) == RULE and _FILLED in n.metadata_props
    ]:
        scores, biased = added.inputs
        bias = biased.producer() if biased is not None else None
        if bias is None or bias.op_type != "Where" or len(biased.uses()) != 1:  # type: ignore[union-attr]
            continue
        allowed, _, negative = bias.inputs
        fill = ir.Node("", "Where", [allowed, scores, negative])
        put_back(graph, fill, added, [added, bias])
        undone += 1
    return undone


def _as_bias(node: ir.Node, fresh_name) -> list[ir.Node] | None:
    """The bias form of ``Where(c, x, y)``: from a blocked condition, a masked_fill of
    the scores, or the older float mask; None when it is none of these (or already is
    the bias form)."""
    nodes: list[ir.Node] = []
    found = _bias_form(node, fresh_name, nodes)
    if found is None:
        _discard(nodes)  # tried and not taken: no reader of the mask may stay behind
    return found


def _discard(nodes: list[ir.Node]) -> None:
    """Disconnect nodes made and not used: a new node reads its inputs from the moment
    it is made, and a reader no graph holds would still count as one (the MoE block
    search would see the mask read outside it)."""
    for node in nodes:
        for index in range(len(node.inputs)):
            node.replace_input_with(index, None)


def _bias_form(node: ir.Node, fresh_name, nodes: list[ir.Node]) -> list[ir.Node] | None:
    """``_as_bias``'s answer; the nodes it made on the way go into ``nodes``."""
    condition, x, y = node.inputs
    a, b = constant_array(x), constant_array(y)
    if condition is None or x is None or y is None:
        return None
    if a is not None and b is not None:
        if np.all(b == 0) and np.all(a < 0):  # Where(blocked, negative, 0)
            allowed = _negated(condition, nodes)
            return [*nodes, ir.Node("", "Where", [allowed, y, x])]
        allowed = _without_not(condition, nodes)  # Where(Not(blocked), 0, negative)
        if allowed is condition or not (np.all(a == 0) and np.all(b < 0)):
            return None
        return [*nodes, ir.Node("", "Where", [allowed, x, y])]
    if a is None and b is not None and b.size == 1 and b.reshape(-1)[0] <= _FILL:
        allowed = _without_not(condition, nodes)  # Where(allowed, scores, negative)
        return _filled(allowed, nodes, x, y, fresh_name)
    if b is None and a is not None and a.size == 1 and a.reshape(-1)[0] <= _FILL:
        found = _allowed_from_float(condition, y)  # the older float mask
        if found is not None:
            return [ir.Node("", "Where", [found, _zero(y.dtype, fresh_name), x])]
        allowed = _negated(condition, nodes)  # Where(blocked, negative, scores)
        return _filled(allowed, nodes, y, x, fresh_name)
    return None


def _filled(allowed, nodes, scores: ir.Value, negative: ir.Value, fresh_name):
    """``Add(scores, Where(allowed, 0, negative))`` after ``nodes``."""
    if scores.dtype not in _FLOATS or negative.dtype != scores.dtype:
        return None
    bias = ir.Node("", "Where", [allowed, _zero(scores.dtype, fresh_name), negative])
    bias.outputs[0].dtype, bias.outputs[0].shape = scores.dtype, allowed.shape
    added = ir.Node("", "Add", [scores, bias.outputs[0]])
    added.metadata_props[_FILLED] = "1"
    return [*nodes, bias, added]


def _zero(dtype: ir.DataType, fresh_name) -> ir.Value:
    zero = ir.Value(
        name=fresh_name(f"{RULE}_zero"), const_value=ir.tensor(np.array(0, _NUMPY[dtype]))
    )
    zero.dtype, zero.shape = dtype, ir.Shape([])
    return zero


def _float_mask(node: ir.Node, fresh_name) -> list[ir.Node] | None:
    """``Where(m, 0, negative)`` for ``Mul(Sub(1, Cast(m, float)), negative)``."""
    for inverted, negative in (node.inputs, reversed(node.inputs)):
        fill = constant_array(negative)
        if fill is None or fill.size != 1 or not np.isfinite(fill).all() or fill.item() >= 0:
            continue
        allowed = _boolean_of_inverted(inverted)
        if allowed is None or negative.dtype != node.outputs[0].dtype:
            continue
        zero = _zero(node.outputs[0].dtype, fresh_name)
        return [ir.Node("", "Where", [allowed, zero, negative])]
    return None


def _allowed_from_float(condition: ir.Value, inverted: ir.Value) -> ir.Value | None:
    """``m`` where ``condition`` is ``Cast(inverted, bool)`` and ``inverted = 1 -
    Cast(m, float)`` with ``m`` boolean: the condition says "blocked", ``m`` "allowed"."""
    cast = condition.producer()
    if cast is None or cast.op_type != "Cast" or cast.inputs[0] is not inverted:
        return None
    if attribute_value(cast, "to", None) != ir.DataType.BOOL:
        return None
    return _boolean_of_inverted(inverted)


def _boolean_of_inverted(inverted: ir.Value | None) -> ir.Value | None:
    """``m`` of ``Sub(1, Cast(m, float))`` with ``m`` boolean, else None."""
    sub = inverted.producer() if inverted is not None else None
    if sub is None or sub.op_type != "Sub" or sub.domain not in _ONNX:
        return None
    one = constant_array(sub.inputs[0])
    cast = sub.inputs[1].producer() if sub.inputs[1] is not None else None
    if one is None or one.size != 1 or one.item() != 1 or cast is None:
        return None
    if cast.op_type != "Cast" or cast.inputs[0] is None:
        return None
    return cast.inputs[0] if cast.inputs[0].dtype == ir.DataType.BOOL else None


def _negated(condition: ir.Value, nodes: list[ir.Node], depth: int = 0) -> ir.Value:
    """A value equal to ``Not(condition)``: one already in the graph where it can be
    read off, else the output of new nodes (appended to ``nodes``)."""
    producer = condition.producer()
    op = producer.op_type if producer is not None and producer.domain in _ONNX else None
    new: ir.Node | None = None
    if op == "Not":
        return producer.inputs[0]  # type: ignore[union-attr,return-value]
    if op in _FLIPPED and all(v is not None and v.dtype in _INTEGERS for v in producer.inputs):
        new = ir.Node("", _FLIPPED[op], list(producer.inputs))
    elif op == "Equal" and _is_zero(producer.inputs[1]):
        source = producer.inputs[0]  # x == 0 of an integer mask: not x is Cast(x, bool)
        if source is not None and (source.dtype in _INTEGERS or source.dtype == ir.DataType.BOOL):
            new = ir.Node("", "Cast", [source], [ir.AttrInt64("to", ir.DataType.BOOL)])
    elif op == "Or" and depth < _DEPTH:  # not (a or b) = not a and not b
        terms = [_negated(term, nodes, depth + 1) for term in producer.inputs]
        new = ir.Node("", "And", terms)
    if new is None:
        new = ir.Node("", "Not", [condition])
    new.outputs[0].dtype, new.outputs[0].shape = ir.DataType.BOOL, condition.shape
    nodes.append(new)
    return new.outputs[0]


def _without_not(condition: ir.Value, nodes: list[ir.Node]) -> ir.Value:
    """``condition``, or where it is ``Not(x)`` and ``x`` negates without a Not (a
    comparison of integers, an Or of those), that negation (its nodes added to
    ``nodes``): the causal proof reads comparisons, not their negations."""
    producer = condition.producer()
    if producer is None or producer.op_type != "Not" or producer.domain not in _ONNX:
        return condition
    trial: list[ir.Node] = []
    negation = _negated(producer.inputs[0], trial)  # type: ignore[arg-type]
    if any(n.op_type == "Not" for n in trial):
        _discard(trial)
        return condition
    nodes += trial
    return negation


def _is_zero(value: ir.Value | None) -> bool:
    constant = constant_array(value)
    return constant is not None and constant.size == 1 and constant.item() == 0


_NUMPY = {ir.DataType.FLOAT: np.float32, ir.DataType.FLOAT16: np.float16}
