"""Rule ``head_scale``: attention scores scaled by a constant per head scale the query
heads instead.

Swin-V2's cosine attention multiplies the scores of head ``n`` by a learned
``exp(min(logit_scale[n], log 100))``: a constant ``c`` of ``[N, 1, 1]`` (``[1, N, 1,
1]``) once constant folding has computed it. The attention patterns read one number
scaling the scores. Each score of head ``n`` is ``sum_h q[n, i, h] k[n, j, h]`` times
``c[n]``, so::

    Mul(MatMul(Q, K^T), c)  ->  MatMul(Mul(Q, c), K^T)        (also Div, either for both)

and where ``Q`` is the head Transpose ``Transpose(y, [0, 2, 1, 3])`` of ``[B, S, N, H]``
heads read by these scores alone, the Mul is written on ``y`` with ``c`` as ``[N, 1]``,
an op that acts per head, where ``head_split`` finds it (as Qwen3's q/k norms). The
scores then carry no scale: ``unit_scale`` multiplies them by 1, and the fused op takes
scale 1 and the query as the graph computes it.

In real arithmetic the two are equal; in floating point the product is rounded on each
query element before the dot product instead of on each score after it, as
``scale_to_scores`` rounds a split scale once instead of twice (exact where ``c`` holds
powers of two), and the check of every job compares the results as it does for any
fusion. Only a constant that varies along the heads alone moves (more than one number:
one number is ``scale_to_scores``'s and the patterns' own), on scores a Softmax reads.

``undo_head_scales`` puts the scale back on the scores where no fusion took them: the
query's Mul still feeds the head Transpose (or the scores) alone, so the graph computes
what it did, bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import array_initializer, take_place
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import SizeProof, proven_same

__all__ = ["RULE", "head_scales", "undo_head_scales"]

RULE = "head_scale"
_MOVED = "autofusion.head_scale"  # on the query's Mul: what the undo puts back
_ONNX = ("", "ai.onnx")
_HEAD_PERM = [0, 2, 1, 3]
_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


def head_scales(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Move every per-head constant scale of attention scores onto the query; how many."""
    proof = SizeProof()
    moved = 0
    for node in list(graph):
        found = _per_head(node, proof)
        if found is not None:
            _move(graph, node, *found, fresh_name, mark)
            moved += 1
    return moved


def _per_head(node: ir.Node, proof: SizeProof) -> tuple[ir.Node, int, np.ndarray] | None:
    """(the score MatMul, the side of the scores, the constant) where ``node`` scales
    attention scores ``[B, N, S, L]`` by a constant of one number per head."""
    if node.op_type not in ("Mul", "Div") or node.domain not in _ONNX or len(node.inputs) != 2:
        return None
    if node.outputs[0].is_graph_output():
        return None
    for side in (0, 1) if node.op_type == "Mul" else (0,):
        scores, scale = node.inputs[side], node.inputs[1 - side]
        matmul = scores.producer() if scores is not None else None
        array = constant_array(scale)
        if matmul is None or matmul.op_type != "MatMul" or matmul.domain not in _ONNX:
            continue
        if array is None or array.size < 2 or array.ndim > 4 or scale.dtype != scores.dtype:  # type: ignore[union-attr]
            continue
        if scores.dtype not in _TYPES or len(scores.shape or ()) != 4:  # type: ignore[union-attr]
            continue
        if scores.is_graph_output() or len(scores.uses()) != 1 or not reads_into_softmax(scores):  # type: ignore[union-attr]
            continue
        laid = (1,) * (4 - array.ndim) + array.shape
        if laid[0] != 1 or laid[2:] != (1, 1) or (node.op_type == "Div" and not array.all()):
            continue
        if proven_same(proof, ((scale, array.ndim - 3), (scores, 1))):  # type: ignore[arg-type]
            return matmul, side, array
    return None


def _head_turn(q: ir.Value | None) -> ir.Node | None:
    """The head Transpose giving ``q``, where the scores alone read ``q``."""
    turn = q.producer() if q is not None else None
    if turn is None or turn.op_type != "Transpose" or turn.domain not in _ONNX:
        return None
    if list(attribute_value(turn, "perm", []) or []) != _HEAD_PERM:
        return None
    return turn if len(q.uses()) == 1 and not q.is_graph_output() else None  # type: ignore[union-attr]


def _move(
    graph: ir.Graph,
    node: ir.Node,
    matmul: ir.Node,
    side: int,
    array: np.ndarray,
    fresh_name: Callable[[str], str],
    mark: str,
) -> None:
    heads = array.size
    turn = _head_turn(matmul.inputs[0])
    data = turn.inputs[0] if turn is not None else matmul.inputs[0]
    laid = array.reshape((heads, 1) if turn is not None else (heads, 1, 1))
    constant = array_initializer(graph, fresh_name(f"{RULE}_scale"), laid)
    scaled = ir.Node("", node.op_type, [data, constant], name=fresh_name(f"{RULE}_{node.op_type}"))
    scaled.outputs[0].name = fresh_name(f"{RULE}_query")
    scaled.outputs[0].dtype, scaled.outputs[0].shape = data.dtype, data.shape  # type: ignore[union-attr]
    scaled.metadata_props[mark] = RULE
    scores = matmul.outputs[0]
    record = [node.op_type, side, list(array.shape), scores.name]
    scaled.metadata_props[_MOVED] = json.dumps(record)
    graph.insert_before(turn if turn is not None else matmul, [scaled])
    (turn if turn is not None else matmul).replace_input_with(0, scaled.outputs[0])
    take_place(node.outputs[0], scores)
    graph.remove(node, safe=True)


def undo_head_scales(graph: ir.Graph, mark: str) -> int:
    """Put the scale back on the scores wherever the query's Mul still feeds its scores
    (through the head Transpose or not): no fusion took them. How many."""
    undone = 0
    for scaled in [n for n in graph if n.metadata_props.get(mark) == RULE]:
        matmul, turn = _scores_of(scaled.outputs[0])
        if matmul is None or matmul.outputs[0].is_graph_output():
            continue
        op, side, shape, name = json.loads(scaled.metadata_props[_MOVED])
        array = scaled.inputs[1].const_value.numpy().reshape(shape)  # type: ignore[union-attr]
        constant = array_initializer(graph, f"{scaled.name}_undone", array)
        scores = matmul.outputs[0]
        again = ir.Node("", op, [scores, constant][:: 1 if side == 0 else -1], name=scaled.name)
        again.outputs[0].dtype, again.outputs[0].shape = scores.dtype, scores.shape
        graph.insert_after(matmul, [again])
        for use in list(scores.uses()):
            if use.node is not again:
                use.node.replace_input_with(use.idx, again.outputs[0])
        again.outputs[0].name, scores.name = scores.name, name
        (turn if turn is not None else matmul).replace_input_with(0, scaled.inputs[0])
        graph.remove(scaled, safe=True)
        undone += 1
    return undone


def _scores_of(query: ir.Value) -> tuple[ir.Node | None, ir.Node | None]:
    """(the score MatMul, the head Transpose between) reading the scaled ``query`` as
    the rule left it; (None, None) where anything else reads it (a fusion took it)."""
    readers = [use.node for use in query.uses()]
    if len(readers) != 1 or query.is_graph_output():
        return None, None
    turn = readers[0] if readers[0].op_type == "Transpose" else None
    if turn is not None:
        readers = [use.node for use in turn.outputs[0].uses()]
        if len(readers) != 1 or turn.outputs[0].is_graph_output():
            return None, None
    reader = readers[0]
    wanted = turn.outputs[0] if turn is not None else query
    if reader.op_type != "MatMul" or reader.inputs[0] is not wanted:
        return None, None
    return reader, turn
