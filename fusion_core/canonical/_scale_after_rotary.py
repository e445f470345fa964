"""Rule ``scale_after_rotary``: a query scaled by a scalar constant before its fused
rotary embedding (ESM's ``query_layer * self.scaling`` on the transposed heads) is
scaled after it.

The rotary embedding is linear in its input: ``R(x) = x * cos + rotate(x) * sin``, with
``rotate`` a permutation and negation of ``x``'s entries, so ``R(c * x) = c * R(x)`` for
a number ``c``::

    RotaryEmbedding(Mul(x, c), ..)  ->  Mul(RotaryEmbedding(x, ..), c)

(``Div(x, c)`` alike). The rotary then reads the head Transpose, which
``transpose_after_rotary`` moves after it, and the scale sits on the query the scores
read, which ``scale_to_scores`` takes onto the scores. In real arithmetic the two are
equal; in floating point ``(c x) cos`` and ``c (x cos)`` round differently (within a
few units in the last place of each product), as ``scale_to_scores`` does, and the check
of every job compares the results as it does for any fusion.

``undo_scale_after_rotaries`` puts the scale back before the rotary wherever no
attention took it: each input the rule moved a scale off is marked, and from it the
chain of the rotary (through ``transpose_after_rotary``'s Reshapes and Transpose, each
read by the next alone) to a Mul or Div by the same constant (the rule's, or the one
``undo_scales`` wrote back) is searched; that scale goes onto the rotary's input, which
is the original arithmetic (a Reshape or Transpose moves the scaled numbers unchanged).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import array_initializer
from autofusion.fusion_core.ir import constant_array

__all__ = ["RULE", "scale_after_rotaries", "undo_scale_after_rotaries"]

RULE = "scale_after_rotary"
_KEY = "autofusion.canonical.scale_after_rotary"  # on the rotated input: the scale moved
_ONNX = ("", "ai.onnx")
_ROTARIES = {("", "RotaryEmbedding"), ("ai.onnx", "RotaryEmbedding")}
_ROTARIES |= {("com.microsoft", "RotaryEmbedding")}
_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})
_CHAIN = 4  # the rotary and transpose_after_rotary's Reshape, Reshape and Transpose


def scale_after_rotaries(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Move every scalar scale a fused rotary alone reads after the rotary; how many."""
    moved = 0
    for rotary in list(graph):
        found = _scale_before(rotary)
        if found is None:
            continue
        scale, x, factor = found
        out = rotary.outputs[0]
        readers = list(out.uses())
        late = ir.Node(
            "", scale.op_type, [out, scale.inputs[1 - _side(scale)]], name=fresh_name(RULE)
        )
        late.outputs[0].name = fresh_name(f"{out.name or RULE}_scaled")
        late.outputs[0].dtype = out.dtype if out.dtype is not None else x.dtype
        late.outputs[0].shape = out.shape
        late.metadata_props[mark] = RULE
        rotary.replace_input_with(0, x)
        graph.insert_after(rotary, [late])
        for use in readers:
            use.node.replace_input_with(use.idx, late.outputs[0])
        graph.remove(scale, safe=True)
        record = json.dumps([scale.op_type, factor])
        x.metadata_props[_KEY] = record
        before = x.producer()
        if before is not None and before.op_type == "Transpose" and before.inputs[0] is not None:
            before.inputs[0].metadata_props[_KEY] = record  # what transpose_after_rotary keeps
        moved += 1
    return moved


def _side(scale: ir.Node) -> int:
    """The index of the data operand of a Mul or Div by a constant."""
    return 1 if constant_array(scale.inputs[0]) is not None else 0


def _scale_before(rotary: ir.Node) -> tuple[ir.Node, ir.Value, float] | None:
    """(the Mul or Div, its data operand, its number) where ``rotary`` is a fused rotary
    whose data input is that op's output, read by the rotary alone."""
    if (rotary.domain, rotary.op_type) not in _ROTARIES or not rotary.inputs:
        return None
    value = rotary.inputs[0]
    scale = value.producer() if value is not None else None
    if scale is None or scale.op_type not in ("Mul", "Div") or scale.domain not in _ONNX:
        return None
    if len(scale.inputs) != 2 or None in scale.inputs or value.dtype not in _TYPES:  # type: ignore[union-attr]
        return None
    if len(value.uses()) != 1 or value.is_graph_output() or rotary.outputs[0].is_graph_output():  # type: ignore[union-attr]
        return None
    side = _side(scale)
    if scale.op_type == "Div" and side != 0:
        return None  # c / x is no scale
    constant = constant_array(scale.inputs[1 - side])
    x = scale.inputs[side]
    if constant is None or constant.size != 1 or constant_array(x) is not None:
        return None
    number = float(constant.reshape(-1)[0])
    if not np.isfinite(number) or (scale.op_type == "Div" and number == 0):
        return None
    if x.shape is None or scale.outputs[0].shape is None:  # type: ignore[union-attr]
        return None
    if list(x.shape) != list(scale.outputs[0].shape):  # type: ignore[union-attr,arg-type]
        return None  # the constant broadcasts nothing
    return scale, x, number  # type: ignore[return-value]


def undo_scale_after_rotaries(graph: ir.Graph, mark: str) -> int:
    """Put every scale the rule moved that no attention took back before its rotary; how
    many. Takes the marks off every value."""
    undone = 0
    values = [*graph.inputs, *(v for n in graph for v in n.outputs)]
    marked = [v for v in values if _KEY in v.metadata_props]
    for value in marked:
        record = value.metadata_props.pop(_KEY)
        found = _scale_after(value, json.loads(record))
        if found is None:
            continue
        rotary, scale = found
        data = rotary.inputs[0]
        constant = array_initializer(
            graph,
            f"{scale.name}_factor",
            np.array(json.loads(record)[1], data.dtype.numpy()),  # type: ignore[union-attr]
        )
        early = ir.Node("", scale.op_type, [data, constant], name=f"{scale.name}_early")
        early.outputs[0].name = f"{data.name}_{RULE}"  # type: ignore[union-attr]
        early.outputs[0].dtype, early.outputs[0].shape = data.dtype, data.shape  # type: ignore[union-attr]
        graph.insert_before(rotary, [early])
        rotary.replace_input_with(0, early.outputs[0])
        kept = scale.inputs[_side(scale)]
        scale.outputs[0].replace_all_uses_with(kept, replace_graph_outputs=True)  # type: ignore[arg-type]
        graph.remove(scale, safe=True)
        undone += 1
    for value in values:
        value.metadata_props.pop(_KEY, None)
    return undone


def _scale_after(value: ir.Value, record: list) -> tuple[ir.Node, ir.Node] | None:
    """(the rotary, the scale) where ``value`` is read by a chain of sole readers (ONNX
    Reshapes and Transposes, one fused rotary) ending in a Mul or Div by the recorded
    number, the rotary reading ``value`` or a Reshape of it."""
    op, number = record
    rotary = None
    for _ in range(_CHAIN + 1):
        readers = [use.node for use in value.uses()]
        if len(readers) != 1 or value.is_graph_output():
            return None
        node = readers[0]
        if (node.domain, node.op_type) in _ROTARIES and rotary is None:
            if node.inputs[0] is not value:
                return None
            rotary = node
        elif node.op_type in ("Reshape", "Transpose") and node.domain in _ONNX:
            if node.inputs[0] is not value:
                return None
        elif node.op_type == op and node.domain in _ONNX and rotary is not None:
            if node.inputs[_side(node)] is not value:
                return None
            constant = constant_array(node.inputs[1 - _side(node)])
            same = constant is not None and constant.size == 1
            return (rotary, node) if same and float(constant.reshape(-1)[0]) == number else None  # type: ignore[union-attr]
        else:
            return None
        value = node.outputs[0]
    return None
