"""Where an attention reads its heads: what the rules that rewrite the query, key and
value heads (``concat_heads``, ``scatter_parts``) look at, so that they touch heads, not
every Concat or ScatterND.

The places: the score MatMul's input 0 (the queries), the input of K^T
(``Transpose(k, [0, 1, 3, 2])``, the score MatMul's input 1) and the context MatMul's
input 1 (the values, where its input 0 comes from the Softmax). A score MatMul is one
whose output reaches a Softmax through the ops a scale, soft-cap, mask or attention
sinks are made of.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.patterns import attribute_value

__all__ = ["attention_reads"]

_ONNX = ("", "ai.onnx")
_KT_PERM = [0, 1, 3, 2]
_DEPTH = 12
_TO_SOFTMAX = frozenset({"Mul", "Div", "Add", "Sub", "Tanh", "Where", "Concat", "Cast"})
_FROM_SOFTMAX = frozenset({"Where", "IsNaN", "Slice", "Cast", "Identity"})


def attention_reads(graph: ir.Graph) -> list[list[tuple[ir.Node, int]]]:
    """Per attention, (reader, input index) of each place it reads its query, key and
    (where the context MatMul is found) value heads: the score MatMul's input 0, K^T's
    input, the context MatMul's input 1."""
    found: list[list[tuple[ir.Node, int]]] = []
    for node in graph:
        if node.op_type != "MatMul" or node.domain not in _ONNX or len(node.inputs) != 2:
            continue
        kt = node.inputs[1].producer() if node.inputs[1] is not None else None
        is_kt = kt is not None and kt.op_type == "Transpose" and kt.domain in _ONNX
        if not is_kt or list(attribute_value(kt, "perm", []) or []) != _KT_PERM:
            continue
        softmax = _softmax_after(node.outputs[0])
        if softmax is None:
            continue
        context = _context_after(softmax)
        value = [(context, 1)] if context is not None else []
        found.append([(node, 0), (kt, 0), *value])  # type: ignore[list-item]
    return found


def _softmax_after(value: ir.Value) -> ir.Node | None:
    """The Softmax the scores reach through the ops a scale, soft-cap, mask or sinks
    are made of."""
    pending, seen = [value], 0
    while pending and seen < _DEPTH:
        seen += 1
        for use in pending.pop().uses():
            if use.node.op_type == "Softmax":
                return use.node
            if use.node.op_type in _TO_SOFTMAX:
                pending.append(use.node.outputs[0])
    return None


def _context_after(softmax: ir.Node) -> ir.Node | None:
    """The MatMul that reads the probabilities as its input 0 (through a NaN guard, the
    sinks' Slice, a Cast)."""
    pending = [softmax.outputs[0]]
    for _ in range(4):
        following = []
        for value in pending:
            for use in value.uses():
                reader = use.node
                if reader.op_type == "MatMul" and use.idx == 0:
                    return reader
                if reader.op_type in _FROM_SOFTMAX:
                    following.append(reader.outputs[0])
        pending = following
    return None
