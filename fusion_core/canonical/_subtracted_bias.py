"""Rule ``subtracted_bias``: a bias subtracted from attention scores is added, negated.

Funnel subtracts its mask, ``scores - 1e6 * (1 - m)``; the attention patterns and
``one_bias`` read biases added to the scores. So::

    Sub(s, Mul(x, c))  ->  Add(s, Mul(x, -c))        (c a scalar constant)

where a Softmax reads the difference (through the ops of a mask). Exact: negating a
float is exact, round-to-nearest is symmetric (``(-c) * x == -(c * x)`` bit for bit,
NaN aside) and ``s - t == s + (-t)``. Where no fusion takes the Add, ``undo_subtracted``
writes the Sub back. Funnel's ``-1e6 * (1 - m)`` so added is a finite mask for
``one_bias``, which folds it with the positional and token-type scores where the scores
are proven small enough for -1e6 to absorb them (``_biases``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import array_initializer, drop_unread, replace
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.ir import constant_array

__all__ = ["RULE", "subtracted_biases", "undo_subtracted"]

RULE = "subtracted_bias"
_ONNX = ("", "ai.onnx")
_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


def subtracted_biases(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write each ``Sub(s, c * x)`` a Softmax reads as ``Add(s, (-c) * x)``; how many.
    One negated product serves every Sub of the same product (a mask shared by layers)."""
    negated: dict[int, ir.Value] = {}
    done = 0
    for sub in list(graph):
        found = _subtracted(sub)
        if found is None:
            continue
        mul, x, c = found
        product = sub.inputs[1]
        assert product is not None
        if id(product) not in negated:
            factor = array_initializer(graph, fresh_name(f"{RULE}_factor"), -c)
            times = ir.Node("", "Mul", [x, factor], name=fresh_name(f"{RULE}_Mul"))
            times.outputs[0].name = fresh_name(f"{RULE}_negated")
            times.outputs[0].dtype, times.outputs[0].shape = product.dtype, product.shape
            times.metadata_props[mark] = RULE
            graph.insert_before(sub, [times])
            negated[id(product)] = times.outputs[0]
        added = ir.Node("", "Add", [sub.inputs[0], negated[id(product)]], name=fresh_name(RULE))
        added.outputs[0].dtype, added.outputs[0].shape = sub.outputs[0].dtype, sub.outputs[0].shape
        added.outputs[0].name = fresh_name(f"{RULE}_scores")
        replace(graph, sub, [added], mark, RULE)
        drop_unread(graph, [mul])
        done += 1
    return done


def _subtracted(sub: ir.Node) -> tuple[ir.Node, ir.Value, np.ndarray] | None:
    """(the Mul, x, c) of ``Sub(s, Mul(x, c))`` (either order of the Mul) whose
    difference a Softmax reads; else None."""
    if sub.op_type != "Sub" or sub.domain not in _ONNX or len(sub.inputs) != 2:
        return None
    out, product = sub.outputs[0], sub.inputs[1]
    if out.is_graph_output() or out.dtype not in _TYPES or not reads_into_softmax(out):
        return None
    mul = product.producer() if product is not None else None
    if mul is None or mul.op_type != "Mul" or mul.domain not in _ONNX or product.is_graph_output():  # type: ignore[union-attr]
        return None
    for x, factor in (mul.inputs, reversed(mul.inputs)):
        c = constant_array(factor)
        if (
            x is not None
            and c is not None
            and c.size == 1
            and c.dtype == out.dtype.numpy()
            and constant_array(x) is None  # both constant: a constant bias, left to folding
        ):
            return mul, x, c
    return None


def undo_subtracted(graph: ir.Graph, mark: str) -> int:
    """Write back ``Sub(s, c * x)`` for each ``Add`` of this rule no fusion took."""
    undone = 0
    products: dict[int, ir.Value] = {}
    for added in [n for n in graph if n.metadata_props.get(mark) == RULE and n.op_type == "Add"]:
        times = added.inputs[1].producer() if added.inputs[1] is not None else None
        if times is None or times.metadata_props.get(mark) != RULE or times.op_type != "Mul":
            continue  # another rule rewrote what the Add reads: it stays
        x, factor = times.inputs
        c = constant_array(factor)
        assert x is not None and c is not None
        if id(times) not in products:
            back = array_initializer(graph, f"{times.outputs[0].name}_factor", -c)
            mul = ir.Node("", "Mul", [x, back], name=f"{times.name}_back")
            mul.outputs[0].name = f"{times.outputs[0].name}_back"
            mul.outputs[0].dtype, mul.outputs[0].shape = (
                times.outputs[0].dtype,
                times.outputs[0].shape,
            )
            graph.insert_before(times, [mul])
            products[id(times)] = mul.outputs[0]
        sub = ir.Node("", "Sub", [added.inputs[0], products[id(times)]], name=f"{added.name}_Sub")
        sub.outputs[0].dtype, sub.outputs[0].shape = added.outputs[0].dtype, added.outputs[0].shape
        sub.outputs[0].name = f"{added.outputs[0].name}_sub"
        graph.insert_before(added, [sub])
        added.outputs[0].replace_all_uses_with(sub.outputs[0], replace_graph_outputs=True)
        graph.remove(added, safe=True)
        drop_unread(graph, [times])
        undone += 1
    return undone
