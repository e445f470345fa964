"""Rule ``blend_mask``: a mask written as a multiplicative blend of the scores and a
fill (OpenAI GPT's ``w = w * b + -1e4 * (1 - b)``, ``b = bias[:, :, :S, :L]`` sliced
from a registered ``tril(ones)`` buffer) is the masked_fill ``Where(b, w, c)``, with the
condition read as the same slices of the buffer made boolean, where the masked_fill
and buffer readings (``mask_as_bias``, ``buffer_mask``) take it.

The spellings read, each only where a Softmax reads the sum (through the mask's ops):
``Add(Mul(w, b), Mul(inv, c))`` in either operand order of each Add and Mul, ``inv``
being ``1 - b`` written ``Sub(1, b)`` or ``Add(Neg(b), 1)`` (either order), and
``Sub(Mul(w, b), Mul(inv, d))``, which is the first with ``c = -d``; where ``b`` is a
whole constant, constant folding has made ``c * (1 - b)`` a constant, read so (0 where
``b`` is 1, one ``c`` where it is 0). ``c`` (``d``) is a finite scalar constant of the
scores' type; ``b`` is proven to hold only 0 and 1: a constant whose every value is
checked, or the Slices, Expands, Unsqueezes, Squeezes, Reshapes and Identities of one
(they move values, never make new ones).

Why it is exact, for finite ``w`` (the scores are finite wherever the graph computes a
softmax of them): where ``b`` is 1, ``w * 1 + c * 0`` is ``w + (+-0)``, which is ``w``
(as a number: a zero's sign may differ, which ``exp`` does not see); where ``b`` is 0,
``w * 0 + c * 1`` is ``(+-0) + c``, which is ``c``. ``Where(Cast(b, bool), w, c)``
broadcasts ``w`` and ``b`` as the Muls did (``c`` is one number), so the shape is the
Add's. The boolean condition is computed by the same movement ops over the constant's
``!= 0``, which holds the same values as ``Cast(b, bool)``: that is the form
``buffer_mask`` reads as ``key <= query``.

The rule proves nothing about the fill: ``Where(b, w, c)`` is what the graph computes.
Note that it is no additive mask: where ``b`` is 0 the original holds ``c``, not ``w +
c``, and a fill the scores do not absorb (``-1e4``: ``w - 1e4`` is not ``-1e4``) is told
apart by the Softmax (a row whose kept keys are all padded shares its weight equally
among the masked keys, whatever their scores). ``mask_as_bias`` takes only fills of at
most ``-1e30``; ``bounded_fill`` makes the fill -1e30 where it proves that the Softmax
cannot tell the two apart.

What no fusion took is put back (``undo_blend_masks``): each ``Where`` whose condition
is still the movement ops of a boolean constant this rule made (the masked_fill and
buffer undos run first and give it back so) is written ``Add(Mul(w, b), Mul(Sub(1, b),
c))`` again, ``b`` the same ops over the constant as it was (an initializer of its old
name where no node reads it any longer).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import (
    array_initializer,
    drop_unread,
    free_name,
    replace,
)
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.ir import constant_array

__all__ = ["RULE", "blend_masks", "undo_blend_masks"]

RULE = "blend_mask"
_ONNX = ("", "ai.onnx")
_FLOATS = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})
_MOVES = frozenset({"Slice", "Expand", "Unsqueeze", "Squeeze", "Reshape", "Identity"})
_DEPTH = 8
_PREFIX = f"{RULE}_"  # the boolean constants this rule makes: their names start so
_WAS = "autofusion.canonical.blend_mask.was"  # on a boolean constant: the float one


def blend_masks(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Rewrite each blend of scores and a fill read by a Softmax as ``Where(b, w, c)``;
    how many."""
    done = 0
    conditions: dict[int, ir.Value] = {}  # id of b -> its boolean condition, made once
    for node in list(graph):
        if node.op_type not in ("Add", "Sub") or node.domain not in _ONNX:
            continue
        out = node.outputs[0]
        if len(node.inputs) != 2 or out.dtype not in _FLOATS or out.is_graph_output():
            continue
        found = _blend(node)
        if found is None or not reads_into_softmax(out):
            continue
        scores, b, number = found
        fill = _scalar(number, scores.dtype, fresh_name(f"{RULE}_fill"))
        condition, made = _condition(graph, b, conditions, fresh_name)
        where = ir.Node("", "Where", [condition, scores, fill], name=fresh_name(f"{RULE}_Where"))
        where.outputs[0].name = fresh_name(f"{RULE}_masked")
        where.outputs[0].dtype, where.outputs[0].shape = out.dtype, out.shape
        producers = [v.producer() for v in node.inputs if v is not None]
        replace(graph, node, [*made, where], mark, RULE)
        drop_unread(graph, producers)
        done += 1
    return done


def _blend(node: ir.Node) -> tuple[ir.Value, ir.Value, float] | None:
    """(w, b, c) of ``w * b + c * (1 - b)`` (or ``w * b - d * (1 - b)``, ``c = -d``)."""
    for kept, filled in (node.inputs, tuple(reversed(node.inputs))):
        if node.op_type == "Sub" and kept is not node.inputs[0]:
            continue  # a - b: only the first operand is the kept scores
        for scores, b in _operands(kept, "Mul"):
            sign = -1.0 if node.op_type == "Sub" else 1.0
            fill = _fill_of(filled, b, scores.dtype)
            fill = sign * fill if fill is not None else _folded_fill(filled, b, scores.dtype, sign)
            if fill is None or not _zero_one(b) or scores.dtype not in _FLOATS:
                continue
            return scores, b, fill
    return None


def _operands(value: ir.Value | None, op: str) -> list[tuple[ir.Value, ir.Value]]:
    """The two inputs of ``value``'s producer ``op``, in both orders (none if it is
    another op)."""
    producer = value.producer() if value is not None else None
    if producer is None or producer.op_type != op or producer.domain not in _ONNX:
        return []
    a, b = producer.inputs if len(producer.inputs) == 2 else (None, None)
    return [] if a is None or b is None else [(a, b), (b, a)]


def _fill_of(value: ir.Value | None, b: ir.Value, dtype: ir.DataType | None) -> float | None:
    """The scalar constant ``c`` of ``c * (1 - b)`` (either order), else None."""
    for inverted, constant in _operands(value, "Mul"):
        array = constant_array(constant)
        if array is None or array.size != 1 or constant.dtype != dtype:
            continue
        if not np.isfinite(array).all() or not _is_one_minus(inverted, b):
            continue
        return float(array.item())
    return None


def _folded_fill(
    value: ir.Value | None, b: ir.Value, dtype: ir.DataType | None, sign: float
) -> float | None:
    """``sign * c`` where ``value`` is the constant ``c * (1 - b)`` constant folding made
    of a constant ``b``: 0 where ``b`` is 1, one finite ``c`` wherever ``b`` is 0
    (float32's lowest where ``b`` holds no 0: the Where never reads it), else None."""
    folded, mask = constant_array(value), constant_array(b)
    if folded is None or mask is None or value.dtype != dtype or folded.dtype.kind != "f":  # type: ignore[union-attr]
        return None
    try:
        folded, mask = np.broadcast_arrays(folded, mask)
    except ValueError:
        return None
    fills = np.unique(folded[mask == 0])
    if np.any(folded[mask == 1] != 0) or fills.size > 1 or not np.isfinite(fills).all():
        return None
    return sign * float(fills[0]) if fills.size else float(np.finfo(np.float32).min)


def _is_one_minus(value: ir.Value, b: ir.Value) -> bool:
    """Whether ``value`` is ``1 - b``: ``Sub(1, b)``, or ``Add(Neg(b), 1)`` either way."""
    producer = value.producer()
    if producer is None or producer.domain not in _ONNX or len(producer.inputs) != 2:
        return False
    if producer.op_type == "Sub":
        return producer.inputs[1] is b and _number(producer.inputs[0]) == 1.0
    for negated, one in _operands(value, "Add"):
        neg = negated.producer()
        if neg is not None and neg.op_type == "Neg" and neg.inputs[0] is b and _number(one) == 1:
            return True
    return False


def _number(value: ir.Value | None) -> float | None:
    array = constant_array(value) if value is not None else None
    return float(array.reshape(-1)[0]) if array is not None and array.size == 1 else None


def _zero_one(b: ir.Value) -> bool:
    """Whether ``b`` is movement ops of a constant holding only 0 and 1."""
    root = _root(b)
    array = constant_array(root[0]) if root is not None else None
    return array is not None and array.size > 0 and bool(np.all((array == 0) | (array == 1)))


def _root(b: ir.Value) -> tuple[ir.Value, list[ir.Node]] | None:
    """(the constant, the movement ops from it to ``b`` in order) of ``b``, else None."""
    chain: list[ir.Node] = []
    value: ir.Value | None = b
    for _ in range(_DEPTH):
        if constant_array(value) is not None:
            return value, chain[::-1]  # type: ignore[return-value]
        producer = value.producer() if value is not None else None
        if producer is None or producer.op_type not in _MOVES or producer.domain not in _ONNX:
            return None
        chain.append(producer)
        value = producer.inputs[0]
    return None


def _condition(
    graph: ir.Graph, b: ir.Value, made: dict[int, ir.Value], fresh_name: Callable[[str], str]
) -> tuple[ir.Value, list[ir.Node]]:
    """``Cast(b, bool)`` as the movement ops of ``b`` over the constant's ``!= 0`` (new
    nodes to insert, none when ``b`` already has its condition)."""
    if id(b) in made:
        return made[id(b)], []
    constant, chain = _root(b)  # type: ignore[misc]
    array = constant_array(constant) != 0  # type: ignore[operator]
    name = f"{_PREFIX}{constant.name or 'buffer'}"
    value = array_initializer(graph, name, np.asarray(array, np.bool_))
    value.meta[_WAS] = (constant.name, constant_array(constant))
    nodes = _moved(value, chain, ir.DataType.BOOL, lambda op: fresh_name(f"{RULE}_{op}"))
    made[id(b)] = nodes[-1].outputs[0] if nodes else value
    return made[id(b)], nodes


def _moved(
    value: ir.Value, chain: list[ir.Node], dtype: ir.DataType | None, named: Callable[[str], str]
) -> list[ir.Node]:
    """The movement ops of ``chain`` again, over ``value``, each output of ``dtype``
    (``named``: a fresh name for an op type)."""
    nodes: list[ir.Node] = []
    for old in chain:
        new = ir.Node(
            "",
            old.op_type,
            [value, *old.inputs[1:]],
            attributes=list(old.attributes.values()),
            name=named(old.op_type),
        )
        out = new.outputs[0]
        out.name, out.dtype, out.shape = f"{new.name}_out", dtype, None
        if old.outputs[0].shape is not None:
            out.shape = ir.Shape(list(old.outputs[0].shape))
        nodes.append(new)
        value = out
    return nodes


def _scalar(number: float, dtype: ir.DataType | None, name: str) -> ir.Value:
    numpy_type = np.float16 if dtype == ir.DataType.FLOAT16 else np.float32
    value = ir.Value(name=name, const_value=ir.tensor(np.array(number, numpy_type)))
    value.dtype, value.shape = dtype, ir.Shape([])
    return value


def undo_blend_masks(graph: ir.Graph, mark: str) -> int:
    """Write back as ``Add(Mul(w, b), Mul(Sub(1, b), c))`` each ``Where(b, w, c)`` whose
    condition is still movement ops of a boolean constant this rule made; how many."""
    del mark  # what it finds is named, not marked: the other undos rewrite the Where first
    undone = 0
    floats: dict[int, ir.Value] = {}  # id of a condition -> its float b, made once
    for where in [n for n in graph if n.op_type == "Where" and n.domain in _ONNX]:
        condition, scores, fill = where.inputs
        root = _root(condition) if condition is not None else None
        if root is None or scores is None or fill is None or scores.dtype not in _FLOATS:
            continue
        constant, chain = root
        if not (constant.name or "").startswith(_PREFIX) or constant.dtype != ir.DataType.BOOL:
            continue
        if _number(fill) is None or constant_array(scores) is not None:
            continue
        if id(condition) not in floats:
            floats[id(condition)] = _float_again(graph, where, constant, chain, scores.dtype)
        b = floats[id(condition)]
        one = _scalar(1.0, scores.dtype, free_name(graph, f"{where.name}_one"))
        kept = ir.Node("", "Mul", [scores, b])
        inverted = ir.Node("", "Sub", [one, b])
        filled = ir.Node("", "Mul", [inverted.outputs[0], fill])
        blend = ir.Node("", "Add", [kept.outputs[0], filled.outputs[0]])
        for part, made in zip(("kept", "inverse", "filled"), (kept, inverted, filled), strict=True):
            made.name = f"{where.name}_{part}"
            made.outputs[0].name = f"{made.name}_out"
            made.outputs[0].dtype = scores.dtype
        graph.register_initializer(one)
        _written_back(graph, where, [kept, inverted, filled, blend])
        undone += 1
    for name, value in list(graph.initializers.items()):
        if name.startswith(_PREFIX) and not value.uses() and not value.is_graph_output():
            graph.initializers.pop(name)
    return undone


def _float_again(
    graph: ir.Graph,
    where: ir.Node,
    constant: ir.Value,
    chain: list[ir.Node],
    dtype: ir.DataType | None,
) -> ir.Value:
    """``b`` again: the movement ops of ``chain`` over the float constant the boolean
    ``constant`` was made from (the graph's own where it is still there), inserted
    before ``where``."""
    name, array = constant.meta.get(_WAS, ((constant.name or "")[len(_PREFIX) :], None))
    if array is None:
        array = constant_array(constant).astype(dtype.numpy())  # type: ignore[union-attr]
    value = graph.initializers.get(name)
    if value is None or not np.array_equal(constant_array(value), array):  # type: ignore[arg-type]
        value = array_initializer(graph, name or "blend_mask_buffer", array)
    count = iter(range(len(chain)))
    nodes = _moved(value, chain, dtype, lambda op: f"{where.name}_{op}_{next(count)}")
    graph.insert_before(where, nodes)
    return nodes[-1].outputs[0] if nodes else value


def _written_back(graph: ir.Graph, where: ir.Node, nodes: list[ir.Node]) -> None:
    """``nodes`` in ``where``'s place, the last taking its output's readers and type."""
    out, again = where.outputs[0], nodes[-1].outputs[0]
    again.name, again.dtype, again.shape = f"{out.name}_blend", out.dtype, out.shape
    nodes[-1].name = f"{where.name}_blend"
    graph.insert_before(where, nodes)
    out.replace_all_uses_with(again, replace_graph_outputs=True)
    condition = where.inputs[0].producer() if where.inputs[0] is not None else None
    graph.remove(where, safe=True)
    drop_unread(graph, [condition])
