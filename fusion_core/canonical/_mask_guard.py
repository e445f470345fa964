"""Rule ``mask_guard``: the mask applied again after the Softmax, with the condition that
masked its input, is SDPA's NaN guard ``Where(IsNaN(P), 0, P)``.

CPM-Ant writes ``P = Where(c, 0, Softmax(Where(c, -inf, s)))``: the same ``c`` puts
``-inf`` into the Softmax and zeroes its output. Read per row of the Softmax (the
entries it normalizes together), with ``C`` the entries ``c`` masks:

* a row with an entry outside ``C`` whose score is finite: ``exp(-inf - max) = 0`` on
  ``C`` already, so zeroing ``C`` changes nothing, and ``P`` has no NaN for the guard;
* a row inside ``C`` everywhere: ``-inf`` everywhere, the Softmax gives NaN, and both
  the zeroing and the guard give 0 everywhere;
* any other row (a score outside ``C`` that is NaN or +inf, or -inf at every entry
  outside ``C``) has NaN outside ``C``, so the graph's output row is NaN there: the guard
  gives 0. The rule changes nothing that the graph computes as a number.

Spellings of the zeroing read: ``Where(c, 0, P)``, ``Where(Not(c), P, 0)`` (a Not read
through by flipping which side masks), ``Mul(P, Cast(allowed, float))`` of a boolean
``allowed``; of the fill: ``Where(c, negative, s)``, ``Where(allowed, s, negative)``, or
such a Where added to the scores (through at most three Adds: ``scores + (bias +
mask)``). The two conditions must be provably one tensor (``same_value``: the same
value, or one deterministic op over the same inputs, an exporter's mask computed twice)
read alike; a zeroing by another mask is left alone (it zeroes entries the Softmax gave
weight to, which no guard does).

A finite fill (float32's lowest, anything at most -1e30; float16's lowest) makes a row
inside ``C`` uniform, not NaN, and the zeroing gives 0 there: the fill is written as
``-inf`` (that block's own constant) and the zeroing as the guard, which give the same.
That is exact where the scores outside ``C`` exceed the fill by more than exp's
underflow (about 104 in float32, 17 in float16): ``exp(fill - max)`` is then 0, as
``exp(-inf)`` is. It needs the Softmax to be read by the zeroing alone and the fill's
Where (or the Add it is an operand of) by the Softmax alone, since a uniform row becomes
NaN before the guard.

``Mul(P, Cast(allowed))`` after a ``-inf`` fill is ``P`` itself (``0 * NaN`` is NaN, so a
row inside ``C`` stays NaN, as without it): the Mul goes, and nothing is put back.

What no fusion took is put back (``undo_mask_guards``): the fill's constant as it was,
and ``Where(c, 0, P)`` (or ``Where(c, P, 0)``) over the condition the fill reads then.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread, new_initializer, put_back, replace
from autofusion.fusion_core.canonical._guard_reads import (
    Fill,
    Zeroing,
    fills,
    zeroing,
    zeroing_fill,
)
from autofusion.fusion_core.ir import constant_array

__all__ = ["RULE", "masks_as_guards", "undo_mask_guards"]

RULE = "mask_guard"
_ONNX = ("", "ai.onnx")
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})
_GUARD = "autofusion.canonical.mask_guard"  # on the guard's Where: the undo finds it so
_WAS = "autofusion.canonical.mask_guard.fill"  # "initializer=value": the finite fill


def masks_as_guards(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every zeroing of a Softmax's output by the condition that filled its input
    as the NaN guard; how many."""
    done = 0
    for softmax in [n for n in graph if n.op_type == "Softmax" and n.domain in _ONNX]:
        probabilities, scores = softmax.outputs[0], softmax.inputs[0]
        if scores is None or probabilities.dtype not in _FLOATS or softmax.graph is not graph:
            continue
        for use in list(probabilities.uses()):
            found = zeroing(use.node, probabilities)
            fill = zeroing_fill(found, scores) if found is not None else None
            if fill is not None and _rewrite(graph, (found, fill), probabilities, fresh_name, mark):  # type: ignore[arg-type]
                done += 1
                break  # one zeroing per Softmax and pass: a finite fill changed P
    return done


def _rewrite(
    graph: ir.Graph,
    read: tuple[Zeroing, Fill],
    probabilities: ir.Value,
    fresh_name: Callable[[str], str],
    mark: str,
) -> bool:
    """Write the zeroing ``read[0]`` of ``probabilities`` as the guard (or drop it), the
    fill ``read[1]`` as ``-inf`` where finite; whether it did."""
    found, fill = read
    if fill.infinite:
        if found.product:  # P * Cast(allowed) is P: 0 on C already, NaN stays NaN
            cast = [v.producer() for v in found.node.inputs if v is not probabilities]
            found.node.outputs[0].replace_all_uses_with(probabilities)
            graph.remove(found.node, safe=True)
            drop_unread(graph, cast)
            return True
        _guard(graph, found, probabilities, fresh_name, mark, None)
        return True
    if probabilities.is_graph_output() or len(probabilities.uses()) != 1 or not fill.direct:
        return False  # the uniform rows become NaN: nothing else may read them
    converted = _infinite_fill(graph, fill, fresh_name, mark)
    if converted is None:
        return False
    _guard(graph, found, probabilities, fresh_name, mark, converted)
    return True


def _infinite_fill(
    graph: ir.Graph, fill: Fill, fresh_name: Callable[[str], str], mark: str
) -> str | None:
    """Write ``fill`` with a ``-inf`` constant of its own (its Where, and the Add it is
    an operand of, new); ``"initializer=value"`` to put the fill back, or None where its
    output is read elsewhere."""
    old = fill.add if fill.add is not None else fill.where
    if old.outputs[0].is_graph_output() or len(old.outputs[0].uses()) != 1:
        return None
    was = constant_array(fill.negative)
    assert was is not None and fill.negative.dtype is not None
    minus_inf = new_initializer(
        graph, fresh_name(f"{RULE}_minus_inf"), -np.inf, fill.negative.dtype, was.shape
    )
    inputs = [minus_inf if v is fill.negative else v for v in fill.where.inputs]
    where = ir.Node("", "Where", inputs, name=fresh_name(f"{RULE}_Where"))
    _like(where.outputs[0], fill.where.outputs[0], fresh_name(f"{RULE}_fill"))
    new = [where]
    if fill.add is not None:
        added = [where.outputs[0] if v is fill.where.outputs[0] else v for v in fill.add.inputs]
        new.append(ir.Node("", "Add", added, name=fresh_name(f"{RULE}_Add")))
        _like(new[-1].outputs[0], fill.add.outputs[0], fresh_name(f"{RULE}_scores"))
    replace(graph, old, new, mark, RULE)
    drop_unread(graph, [fill.where])
    return f"{minus_inf.name}={float(was.reshape(-1)[0])!r}"


def _guard(
    graph: ir.Graph,
    found: Zeroing,
    probabilities: ir.Value,
    fresh_name: Callable[[str], str],
    mark: str,
    was: str | None,
) -> None:
    """``found`` written as ``Where(IsNaN(P), 0, P)``; ``was`` kept on it for the undo."""
    zero = new_initializer(graph, fresh_name(f"{RULE}_zero"), 0.0, probabilities.dtype)
    is_nan = ir.Node("", "IsNaN", [probabilities], name=fresh_name(f"{RULE}_IsNaN"))
    is_nan.outputs[0].name = fresh_name(f"{RULE}_nan")
    is_nan.outputs[0].dtype, is_nan.outputs[0].shape = ir.DataType.BOOL, probabilities.shape
    guard = ir.Node("", "Where", [is_nan.outputs[0], zero, probabilities])
    guard.name = fresh_name(f"{RULE}_Where")
    _like(guard.outputs[0], found.node.outputs[0], fresh_name(f"{RULE}_guarded"))
    guard.metadata_props[_GUARD] = "1"
    if was is not None:
        guard.metadata_props[_WAS] = was
    producers = [v.producer() for v in found.node.inputs if v is not None]
    replace(graph, found.node, [is_nan, guard], mark, RULE)
    drop_unread(graph, producers)  # a condition computed twice, a Cast of it


def _like(value: ir.Value, model: ir.Value, name: str) -> None:
    value.name, value.dtype, value.shape = name, model.dtype, model.shape


def undo_mask_guards(graph: ir.Graph, mark: str) -> int:
    """Put back every guard this rule wrote that no fusion took: the fill's constant as
    it was, and the zeroing by the condition the fill reads now; how many."""
    undone = 0
    for guard in [
        n for n in graph if n.metadata_props.get(mark) == RULE and _GUARD in n.metadata_props
    ]:
        _restore_fill(graph, guard.metadata_props.get(_WAS))
        nan, zero, probabilities = guard.inputs
        is_nan = nan.producer() if nan is not None else None
        softmax = probabilities.producer() if probabilities is not None else None
        if is_nan is None or softmax is None or softmax.op_type != "Softmax":
            continue
        found = fills(softmax.inputs[0]) if softmax.inputs[0] is not None else []
        if len(found) != 1 or len(nan.uses()) != 1:  # type: ignore[union-attr]
            continue  # the guard stays: it computes what the zeroing did
        cond = found[0].cond
        inputs = [cond, zero, probabilities] if found[0].blocked else [cond, probabilities, zero]
        put_back(graph, ir.Node("", "Where", inputs), guard, [is_nan, guard])
        undone += 1
    return undone


def _restore_fill(graph: ir.Graph, was: str | None) -> None:
    """Give the ``-inf`` constant a finite fill was written with its value back."""
    if not was:
        return
    name, _, number = was.rpartition("=")
    value = graph.initializers.get(name)
    if value is None or value.const_value is None or value.dtype is None:
        return
    shape = value.const_value.numpy().shape
    value.const_value = ir.tensor(np.full(shape, float(number), value.dtype.numpy()))
