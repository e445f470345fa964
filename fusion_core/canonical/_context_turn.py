"""Rule ``context_read_after_transpose``: elementwise ops that read an attention's context
before its head Transpose read it after the Transpose.

A context ``C = P @ V`` (``[B, N, S, Hv]``) may be scaled or shifted per head before the
heads are transposed for their merge, ``Transpose(C * w, [0, 2, 1, 3])`` with ``w`` of
``[N, 1, Hv]`` (a learned per-head gate, a differential attention's ``1 - lambda``).
An elementwise op commutes with a permutation of the axes when its other operand is
permuted alike::

    Transpose(op(C, w), p) == op(Transpose(C, p), Transpose(w4, p))

(``w4``: ``w`` with leading 1s to rank 4, as broadcasting reads it). Every output element
is the same op of the same two numbers, so the value is exact. The attention pattern
reads a context followed by its head Transpose, and ``context_heads`` then gives the ops
the split of whatever the fused op writes. Nothing to undo: where nothing fuses, the ops
simply run after the Transpose, on the same numbers.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._contexts import is_context
from autofusion.fusion_core.canonical._shape_values import known_dims
from autofusion.fusion_core.patterns import attribute_value

__all__ = ["RULE", "context_reads_after_transpose"]

RULE = "context_read_after_transpose"
_HEAD_PERM = [0, 2, 1, 3]
_BINARY = frozenset({"Mul", "Add", "Sub", "Div"})
_ONNX = ("", "ai.onnx")
Fresh = Callable[[str], str]


def _only_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0].node if len(uses) == 1 and not value.is_graph_output() else None


def _constant_side(node: ir.Node, data: ir.Value) -> int | None:
    """Which input of the binary op ``node`` is a constant that broadcasts into ``data``'s
    shape (rank 4 or less, each dim 1 or ``data``'s), the other being ``data``; None
    where it is not so."""
    if node.op_type not in _BINARY or node.domain not in _ONNX or len(node.inputs) != 2:
        return None
    side = 1 if node.inputs[0] is data else 0
    other, dims = node.inputs[side], known_dims(data)
    if node.inputs[1 - side] is not data or other is None or other.const_value is None:
        return None
    shape = other.const_value.numpy().shape
    if dims is None or len(dims) != 4 or len(shape) > 4:
        return None
    padded = (1,) * (4 - len(shape)) + shape
    return side if all(c == 1 or c == d for c, d in zip(padded, dims, strict=True)) else None


def _chain(context: ir.Node) -> tuple[list[tuple[ir.Node, int]], ir.Node] | None:
    """The binary ops from the context to its head Transpose, each with its constant's
    side, and the Transpose; None unless there is at least one op and each value on the
    way has one reader."""
    ops, value = [], context.outputs[0]
    while (reader := _only_reader(value)) is not None:
        if reader.op_type == "Transpose" and reader.domain in _ONNX:
            perm = list(attribute_value(reader, "perm", []) or [])
            return (ops, reader) if ops and perm == _HEAD_PERM else None
        side = _constant_side(reader, value)
        if side is None:
            return None
        ops.append((reader, side))
        value = reader.outputs[0]
    return None


def context_reads_after_transpose(
    graph: ir.Graph, fresh_name: Callable[[str], str], mark: str
) -> int:
    """Move the elementwise ops between every context and its head Transpose after the
    Transpose; how many contexts."""
    done = 0
    for node in list(graph):
        if not is_context(node) or len(known_dims(node.outputs[0]) or []) != 4:
            continue
        found = _chain(node)
        if found is not None:
            _move(graph, node, *found, fresh_name, mark)
            done += 1
    return done


def _move(
    graph: ir.Graph,
    context: ir.Node,
    ops: list[tuple[ir.Node, int]],
    turn: ir.Node,
    fresh_name: Fresh,
    mark: str,
) -> None:
    new_turn = ir.Node("", "Transpose", [context.outputs[0]], [ir.AttrInt64s("perm", _HEAD_PERM)])
    made, source = [new_turn], new_turn.outputs[0]
    for op, side in ops:
        weight = op.inputs[side]
        array = weight.const_value.numpy()
        turned = np.transpose(array.reshape((1,) * (4 - array.ndim) + array.shape), _HEAD_PERM)
        constant = _initializer(graph, fresh_name(f"{RULE}_w"), turned, weight.dtype)
        made.append(ir.Node("", op.op_type, [source, constant][:: 1 if side == 1 else -1]))
        source = made[-1].outputs[0]
    for new in made:  # each op keeps the data's shape (its constant broadcasts into it)
        new.name = fresh_name(f"{RULE}_{new.op_type}")
        new.metadata_props[mark] = RULE
        new.outputs[0].dtype = turn.outputs[0].dtype
        new.outputs[0].shape = turn.outputs[0].shape
    graph.insert_before(turn, made)
    turn.outputs[0].replace_all_uses_with(source, replace_graph_outputs=True)
    graph.remove([turn, *[op for op, _ in reversed(ops)]], safe=True)


def _initializer(
    graph: ir.Graph, name: str, array: np.ndarray, dtype: ir.DataType | None
) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), const_value=ir.tensor(array))
    value.dtype = dtype
    graph.register_initializer(value)
    return value
