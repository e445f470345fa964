"""Rule ``known_scalars``: small values the graph computes from known sizes become
constants.

The TorchScript exporter computes SDPA's scale as ``1 / sqrt(q.shape[-1])`` at run time
(Falcon: ``Sqrt(Div(1, Sqrt(Cast(Slice(Concat(Shape(x)[0], 8, Shape(x)[1], 32), -1)))))``
on Q and again on K); constant folding leaves it because ``Shape(x)`` depends on the
batch. Where every entry such a chain reads is fixed by the shapes (the head size is),
its value is a constant: the integer part is read entry by entry (``entries``), the
float scalars after it computed with numpy, and the patterns then see a constant scale
as every other exporter writes it.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.sizes import entries

__all__ = ["fold_known_scalars"]

_MAX_SIZE = 16  # entries of a value this rule makes constant, at most
_INTEGER_OPS = frozenset(
    {"Shape", "Gather", "Slice", "Concat", "Add", "Sub", "Mul", "Div", "Squeeze", "Unsqueeze"}
)  # Squeeze and Unsqueeze: DeBERTa's head size, sliced from a shape and squeezed
_UNARY = {"Sqrt": np.sqrt, "Reciprocal": np.reciprocal, "Neg": np.negative}
_BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


def fold_known_scalars(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Replace each small computed value whose entries the shapes fix; how many."""
    del mark  # what it inserts are initializers: no node carries a mark
    folded = 0
    for node in list(graph):  # in order: a chain folds from its start in one sweep
        if len(node.outputs) != 1 or node.domain not in ("", "ai.onnx"):
            continue
        out = node.outputs[0]
        if out.is_graph_output() or not out.uses() or constant_array(out) is not None:
            continue
        array = _value_of(node)
        if array is None or array.size > _MAX_SIZE:
            continue
        constant = ir.Value(
            name=fresh_name(f"{out.name or 'known'}_known"),
            shape=ir.Shape(array.shape),
            const_value=ir.tensor(array),
        )
        constant.dtype = out.dtype
        graph.register_initializer(constant)
        out.replace_all_uses_with(constant)
        _remove_with_unread_producers(graph, node)
        folded += 1
    return folded


def _remove_with_unread_producers(graph: ir.Graph, node: ir.Node) -> None:
    """Remove ``node`` and, up the chain, each producer nothing reads any more (the
    ``Shape`` a folded size was read from)."""
    pending = [node]
    while pending:
        dead = pending.pop()
        producers = [v.producer() for v in dead.inputs if v is not None]
        graph.remove(dead, safe=True)
        for producer in producers:
            if producer is None or producer.graph is not graph or producer in pending:
                continue
            if not any(v.uses() or v.is_graph_output() for v in producer.outputs):
                pending.append(producer)


def _value_of(node: ir.Node) -> np.ndarray | None:
    out = node.outputs[0]
    if out.dtype is None or out.shape is None or not out.shape.is_static():
        return None
    if np.prod(out.shape.numpy()) > _MAX_SIZE:
        return None  # before reading the inputs: a MatMul's weight may be lazy (merged)
    if out.dtype in (ir.DataType.INT64, ir.DataType.INT32) and node.op_type in _INTEGER_OPS:
        found = entries(out)
        if found is None or None in found:
            return None
        return np.array(found, out.dtype.numpy()).reshape(out.shape.numpy())
    inputs = [constant_array(v) if v is not None else None for v in node.inputs]
    if not inputs or any(a is None for a in inputs):
        return None
    if node.op_type == "Cast":
        return inputs[0].astype(out.dtype.numpy())  # type: ignore[union-attr]
    if node.op_type in _UNARY and out.dtype.is_floating_point():
        return _UNARY[node.op_type](inputs[0]).astype(out.dtype.numpy())
    if node.op_type in _BINARY and out.dtype.is_floating_point() and len(inputs) == 2:
        return _BINARY[node.op_type](inputs[0], inputs[1]).astype(out.dtype.numpy())
    return None
