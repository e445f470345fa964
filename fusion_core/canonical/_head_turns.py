"""Rules ``context_read_after_transpose`` and ``head_read_before_transpose``: elementwise
ops with a constant that an attention runs on its heads on the far side of a head
Transpose from where the attention pattern reads them move across that Transpose.

An elementwise op commutes with a permutation of the axes when its other operand is
permuted alike::

    Transpose(op(x, w), p) == op(Transpose(x, p), Transpose(w4, p))

(``w4``: ``w`` with leading 1s to rank 4, as broadcasting reads it; the head permutation
``[0, 2, 1, 3]`` is its own inverse). Every output element is the same op of the same two
numbers, so the value is exact, and nothing needs undoing where nothing fuses.

* ``context_read_after_transpose``: a context ``C = P @ V`` (``[B, N, S, Hv]``) scaled or
  shifted per head before the heads are transposed for their merge, ``Transpose(C * w)``
  with ``w`` of ``[N, 1, Hv]`` (a learned per-head gate, a differential attention's
  ``1 - lambda``): the ops run after the Transpose, where ``context_heads`` gives them
  the split of whatever the fused op writes.
* ``head_read_before_transpose``: a query or key scaled per head and channel after its
  head Transpose (and after its rotary), ``Transpose(q) * s`` with ``s`` of ``[N, 1, H]``
  (nGPT's ``s_qk``), read by the scores as it is: the ops run before the Transpose, on
  ``[B, S, N, H]``, where the head split reads ops that act per head (as a q/k norm) and
  the attention pattern finds its head Transpose. The scale cannot move into the
  projection in general (the rotary mixes channel ``i`` with ``i + H/2``), so it stays an
  op of its own.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._attention_reads import attention_reads
from autofusion.fusion_core.canonical._contexts import is_context
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims

__all__ = [
    "CONTEXT_RULE",
    "HEAD_RULE",
    "context_reads_after_transpose",
    "head_reads_before_transpose",
]

CONTEXT_RULE, HEAD_RULE = "context_read_after_transpose", "head_read_before_transpose"
_HEAD_PERM = [0, 2, 1, 3]
_BINARY = frozenset({"Mul", "Add", "Sub", "Div"})
_ONNX = ("", "ai.onnx")
Fresh = Callable[[str], str]
Op = tuple[ir.Node, int]  # a binary op and the side of its constant


def _only_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0].node if len(uses) == 1 and not value.is_graph_output() else None


def _head_transpose(node: ir.Node | None) -> bool:
    return (
        node is not None
        and node.op_type == "Transpose"
        and node.domain in _ONNX
        and list(attribute_value(node, "perm", []) or []) == _HEAD_PERM
    )


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


def context_reads_after_transpose(graph: ir.Graph, fresh_name: Fresh, mark: str) -> int:
    """Move the elementwise ops between every context and its head Transpose after the
    Transpose; how many contexts."""
    done = 0
    for node in list(graph):
        if not is_context(node) or len(known_dims(node.outputs[0]) or []) != 4:
            continue
        ops, value = [], node.outputs[0]
        while (reader := _only_reader(value)) is not None and not _head_transpose(reader):
            side = _constant_side(reader, value)
            if side is None:
                break
            ops.append((reader, side))
            value = reader.outputs[0]
        if ops and _head_transpose(reader):
            _turn(graph, reader, ops, node.outputs[0], reader.outputs[0], fresh_name, mark)
            done += 1
    return done


def head_reads_before_transpose(graph: ir.Graph, fresh_name: Fresh, mark: str) -> int:
    """Move the elementwise ops between a head Transpose and the place an attention reads
    its query or key heads (the score MatMul's input 0, K^T's input) before the
    Transpose; how many places."""
    done = 0
    for places in attention_reads(graph):
        for reader, index in places[:2]:
            value, ops = reader.inputs[index], []
            while value is not None and (producer := value.producer()) is not None:
                if _head_transpose(producer) or _only_reader(value) is None:
                    break
                data = [v for v in producer.inputs if v is not None and v.const_value is None]
                side = _constant_side(producer, data[0]) if len(data) == 1 else None
                if side is None:
                    break
                ops.insert(0, (producer, side))
                value = producer.inputs[1 - side]
            turn = value.producer() if value is not None else None
            if ops and _head_transpose(turn) and _only_reader(value) is ops[0][0]:
                last = ops[-1][0].outputs[0]
                _turn(graph, turn, ops, turn.inputs[0], last, fresh_name, mark, after=False)
                done += 1
    return done


def _turn(
    graph: ir.Graph,
    turn: ir.Node,
    ops: list[Op],
    source: ir.Value,
    replaced: ir.Value,
    fresh_name: Fresh,
    mark: str,
    *,
    after: bool = True,
) -> None:
    """``ops`` (in order) computed on the other side of the head Transpose ``turn``: after
    it, reading ``source`` through a new Transpose (``after``), or before it, on ``source``
    (``turn``'s input), then a new Transpose. The result takes ``replaced``'s readers."""
    rule = CONTEXT_RULE if after else HEAD_RULE
    new_turn = ir.Node("", "Transpose", [source], [ir.AttrInt64s("perm", _HEAD_PERM)])
    made, value = ([new_turn], new_turn.outputs[0]) if after else ([], source)
    for op, side in ops:
        weight = op.inputs[side]
        array = weight.const_value.numpy()
        turned = np.transpose(array.reshape((1,) * (4 - array.ndim) + array.shape), _HEAD_PERM)
        constant = _initializer(graph, fresh_name(f"{rule}_w"), turned, weight.dtype)
        made.append(ir.Node("", op.op_type, [value, constant][:: 1 if side == 1 else -1]))
        value = made[-1].outputs[0]
    if not after:
        new_turn.replace_input_with(0, value)
        made.append(new_turn)
    for new in made:  # each op keeps its data's shape (its constant broadcasts into it)
        new.name = fresh_name(f"{rule}_{new.op_type}")
        new.metadata_props[mark] = rule
        new.outputs[0].dtype = replaced.dtype
        turned_side = new is new_turn or after
        new.outputs[0].shape = replaced.shape if turned_side else source.shape
    graph.insert_before(turn if after else ops[-1][0], made)
    replaced.replace_all_uses_with(made[-1].outputs[0], replace_graph_outputs=True)
    olds = [op for op, _ in ops]
    graph.remove(olds[::-1] + [turn] if after else [*olds[::-1], turn], safe=True)


def _initializer(
    graph: ir.Graph, name: str, array: np.ndarray, dtype: ir.DataType | None
) -> ir.Value:
    value = ir.Value(name=name, shape=ir.Shape(array.shape), const_value=ir.tensor(array))
    value.dtype = dtype
    graph.register_initializer(value)
    return value
