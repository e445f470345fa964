"""Rule ``scale_to_scores``: the attention's scale multiplies the scores, wherever the
exporter put it.

TorchScript's and dynamo's scaled_dot_product_attention split the scale ``1 / sqrt(H)``
over Q and K^T (``sqrt`` of it on each, so that fp16 scores do not overflow); the eager
attention multiplies the scores. Every attention pattern reads the second form, so::

    MatMul(Mul(Q, a), Mul(K^T, b))  ->  Mul(MatMul(Q, K^T), a * b)

for scalar constants ``a`` and ``b`` (either may be absent; a Div by ``c`` is a Mul by
``1 / c``: DeBERTa divides its K^T by ``sqrt(H * scale_factor)``), where the product is
attention scores: rank 4 and read, through the mask and the soft-cap, by a Softmax.
Where the scores are scaled as well (a query divided by a constant, then the eager
scale), that scale is taken into the one Mul: ``Mul(MatMul(Q, K^T), a * b * c)``. In
real arithmetic the two are equal; in floating point the product is rounded once
instead of per operand (exact where ``a`` and ``b`` are powers of two, as for head sizes
16, 64 and 256), and the check of every job compares the results as it does for any
fusion (the fused ops apply the scale in their own order anyway).

What no fusion took is put back as the exporter wrote it (``undo_scales``): on long
sequences the scores are the larger tensor to scale.

Rule ``unit_scale``: scores with no scale at all (T5, trained with the scale folded
into its weights; OPT, BART and Whisper, whose query projection is scaled before the
heads split) are multiplied by 1, so that they read as every other attention's, whose
fused op then takes scale 1 and the query as the graph computes it. The factor of 1 is
taken out again where no fusion took it.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import array_initializer
from autofusion.fusion_core.canonical._softmax_shift import appends_sink_column
from autofusion.fusion_core.ir import constant_array

__all__ = [
    "RULE",
    "UNIT",
    "reads_into_softmax",
    "scales_to_scores",
    "undo_scales",
    "undo_unit_scales",
    "unit_scales",
]

RULE = "scale_to_scores"
UNIT = "unit_scale"
_SPLIT = "autofusion.canonical.split_scale"  # the original a and b, to put them back
_ONNX = ("", "ai.onnx")
_TO_SOFTMAX = frozenset({"Add", "Sub", "Mul", "Div", "Tanh", "Where", "Cast"})
_WALK = 6
# the types whose scores the rules rewrite (a float16 product rounds once, as the check sees)
_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


def scales_to_scores(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Move the scalar scales of every attention's Q and K^T onto its scores; how many."""
    moved = 0
    for matmul in list(graph):
        found = _split_scales(matmul)
        if found is None:
            continue
        (q, a), (k, b) = found
        out_type = matmul.outputs[0].dtype
        product = np.float32(_factor(a)) * np.float32(_factor(b))
        outer = _outer_scale(matmul.outputs[0])  # the scores' own scale: one Mul for both
        if outer is not None:
            product = product * np.float32(_factor(outer[1]))
        scale = ir.Value(
            name=fresh_name(f"{RULE}_scale"),
            shape=ir.Shape([]),
            const_value=ir.tensor(np.array(product, out_type.numpy())),  # the scores' type
        )
        scale.dtype = out_type
        graph.register_initializer(scale)
        scores = ir.Node("", "MatMul", [q, k], name=fresh_name(f"{matmul.name or 'MatMul'}_scores"))
        scaled = ir.Node("", "Mul", [scores.outputs[0], scale], name=fresh_name(f"{RULE}_Mul"))
        out = matmul.outputs[0]
        for value in (scores.outputs[0], scaled.outputs[0]):
            value.dtype, value.shape = out.dtype, out.shape
        scores.outputs[0].name = fresh_name(f"{RULE}_unscaled")
        scaled.outputs[0].name = fresh_name(out.name or RULE)
        for node in (scores, scaled):
            node.metadata_props[mark] = RULE
        scaled.metadata_props[_SPLIT] = json.dumps([a, b] if outer is None else [a, b, outer[1]])
        graph.insert_before(matmul, [scores, scaled])
        if outer is not None:  # the scores' scale goes into this one
            scaled.outputs[0].name = fresh_name(outer[0].outputs[0].name or RULE)
            outer[0].outputs[0].replace_all_uses_with(scaled.outputs[0], replace_graph_outputs=True)
            graph.remove(outer[0], safe=True)
        else:
            out.replace_all_uses_with(scaled.outputs[0])
        operands = [v.producer() for v in matmul.inputs]
        graph.remove(matmul, safe=True)
        for producer in operands:
            if (
                producer is not None
                and producer.op_type in ("Mul", "Div")
                and not producer.outputs[0].uses()
            ):
                graph.remove(producer, safe=True)
        moved += 1
    return moved


def undo_scales(graph: ir.Graph, mark: str) -> int:
    """Put back every scale this rule moved where its scores Mul is still there (no
    fusion took it); how many."""
    undone = 0
    for scaled in [
        n for n in graph if n.metadata_props.get(mark) == RULE and _SPLIT in n.metadata_props
    ]:
        scores = scaled.inputs[0].producer() if scaled.inputs[0] is not None else None
        if scores is None or scores.op_type != "MatMul" or len(scores.outputs[0].uses()) != 1:
            continue
        a, b, *outer = json.loads(scaled.metadata_props[_SPLIT])
        operands = []
        nodes = []
        for value, factor in zip(scores.inputs, (a, b), strict=True):
            if factor is None:
                operands.append(value)
                continue
            nodes.append(_scaled_by(graph, value, factor, f"{scaled.name}_{len(nodes)}"))
            operands.append(nodes[-1].outputs[0])
        again = ir.Node("", "MatMul", operands, name=f"{scaled.name}_MatMul")
        again.outputs[0].dtype, again.outputs[0].shape = (
            scaled.outputs[0].dtype,
            scaled.outputs[0].shape,
        )
        written = [*nodes, again]
        if outer:  # the scores' own scale, which the moved one had taken in
            written.append(_scaled_by(graph, again.outputs[0], outer[0], f"{scaled.name}_outer"))
        graph.insert_before(scaled, written)
        scaled.outputs[0].replace_all_uses_with(written[-1].outputs[0], replace_graph_outputs=True)
        graph.remove(scaled, safe=True)
        graph.remove(scores, safe=True)
        undone += 1
    return undone


def _scaled_by(graph: ir.Graph, value: ir.Value, factor: float | list, name: str) -> ir.Node:
    """``value`` times the recorded ``factor`` (a Div by ``c`` for ``["Div", c]``)."""
    op, number = factor if isinstance(factor, list) else ("Mul", factor)
    constant = array_initializer(
        graph,
        f"{name}_factor",
        np.array(number, value.dtype.numpy()),  # type: ignore[union-attr]
    )
    node = ir.Node("", op, [value, constant], name=name)
    node.outputs[0].dtype, node.outputs[0].shape = value.dtype, value.shape
    return node


def _split_scales(matmul: ir.Node):
    """((Q, a), (K^T, b)) where ``matmul`` multiplies scaled operands into attention
    scores (``a`` or ``b`` None where that side has no scale), else None."""
    if matmul.op_type != "MatMul" or matmul.domain not in _ONNX or len(matmul.inputs) != 2:
        return None
    out = matmul.outputs[0]
    if (
        out.shape is None
        or len(out.shape) != 4
        or out.is_graph_output()
        or not reads_into_softmax(out)
    ):
        return None
    sides = [_scaled(v) for v in matmul.inputs]
    if all(factor is None for _, factor in sides):
        return None
    return sides[0], sides[1]


def _outer_scale(scores: ir.Value) -> tuple[ir.Node, float | list] | None:
    """(the node, its scalar as ``_scaled`` records it) where the scores' one reader
    multiplies or divides them by a scalar constant: the eager attention's scale after a
    scale on Q or K^T (a query divided by a constant, then the scores scaled)."""
    readers = [use.node for use in scores.uses()]
    if len(readers) != 1 or scores.is_graph_output():
        return None
    node = readers[0]
    if node.op_type not in ("Mul", "Div") or node.domain not in _ONNX:
        return None
    if node.op_type == "Div" and node.inputs[0] is not scores:
        return None
    constant = constant_array(node.inputs[1] if node.inputs[0] is scores else node.inputs[0])
    if constant is None or constant.size != 1 or node.outputs[0].is_graph_output():
        return None
    if any(use.node.op_type == "Tanh" for use in node.outputs[0].uses()):
        return None  # a soft-cap's division (c * tanh(s / c)), no scale
    number = float(constant.reshape(-1)[0])
    if node.op_type == "Div":
        return (node, ["Div", number]) if number != 0 else None
    return node, number


def _factor(scale: float | list | None) -> float:
    """What a side's recorded scale multiplies by: 1 without one, ``1 / c`` for a Div."""
    if scale is None:
        return 1.0
    if isinstance(scale, list):  # ["Div", c]
        return float(np.float32(1.0) / np.float32(scale[1]))
    return scale


def _scaled(value: ir.Value | None) -> tuple[ir.Value | None, float | list | None]:
    """(the operand, the scalar) of ``Mul(operand, scalar constant)`` read only here; for
    ``Div(operand, c)`` (DeBERTa's K^T) the scalar is ``["Div", c]``, so that the undo
    writes the Div back."""
    producer = value.producer() if value is not None else None
    if producer is None or producer.op_type not in ("Mul", "Div") or producer.domain not in _ONNX:
        return value, None
    if len(value.uses()) != 1 or value.dtype not in _TYPES:  # type: ignore[union-attr]
        return value, None
    if producer.op_type == "Div":
        divisor = constant_array(producer.inputs[1])
        if divisor is None or divisor.size != 1 or float(divisor.reshape(-1)[0]) == 0:
            return value, None
        return producer.inputs[0], ["Div", float(divisor.reshape(-1)[0])]
    for index in (1, 0):
        factor = constant_array(producer.inputs[index])
        other = producer.inputs[1 - index]
        if factor is not None and factor.size == 1 and other is not None:
            return other, float(factor.reshape(-1)[0])
    return value, None


def reads_into_softmax(value: ir.Value) -> bool:
    """Whether a Softmax reads ``value`` through the ops of a mask or a soft-cap."""
    for _ in range(_WALK):
        readers = [use.node for use in value.uses()]
        if len(readers) != 1:
            return False
        reader = readers[0]
        if reader.op_type == "Softmax":
            return True
        if reader.op_type not in _TO_SOFTMAX and not appends_sink_column(reader, value):
            return False
        value = reader.outputs[0]
    return False


def unit_scales(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Multiply by 1 every attention's scores that no scalar scales; how many."""
    added = 0
    for matmul in list(graph):
        if matmul.op_type != "MatMul" or matmul.domain not in _ONNX or len(matmul.inputs) != 2:
            continue
        out = matmul.outputs[0]
        if (
            out.shape is None
            or len(out.shape) != 4
            or out.dtype not in _TYPES
            or out.is_graph_output()
            or not reads_into_softmax(out)
            or _already_scaled(out)
        ):
            continue
        readers = list(out.uses())
        one = ir.Value(
            name=fresh_name(f"{UNIT}_one"),
            shape=ir.Shape([]),
            const_value=ir.tensor(np.array(1.0, out.dtype.numpy())),
        )
        one.dtype = out.dtype
        graph.register_initializer(one)
        scaled = ir.Node("", "Mul", [out, one], name=fresh_name(f"{UNIT}_Mul"))
        scaled.outputs[0].dtype, scaled.outputs[0].shape = out.dtype, out.shape
        scaled.outputs[0].name = fresh_name(f"{UNIT}_scores")
        scaled.metadata_props[mark] = UNIT
        graph.insert_after(matmul, [scaled])
        for use in readers:
            use.node.replace_input_with(use.idx, scaled.outputs[0])
        added += 1
    return added


def undo_unit_scales(graph: ir.Graph, mark: str) -> int:
    """Take out every factor of 1 ``unit_scales`` put on scores no fusion took."""
    undone = 0
    for scaled in [n for n in graph if n.metadata_props.get(mark) == UNIT]:
        if scaled.outputs[0].is_graph_output():
            continue
        scaled.outputs[0].replace_all_uses_with(scaled.inputs[0])
        graph.remove(scaled, safe=True)
        undone += 1
    return undone


def _already_scaled(scores: ir.Value) -> bool:
    """Whether the one reader of ``scores`` multiplies or divides them (by a constant or
    not: a scale the patterns read, or refuse by name), other than a soft-cap's
    ``s / c`` into a Tanh."""
    (use,) = scores.uses()  # reads_into_softmax: one reader
    reader = use.node
    if reader.op_type not in ("Mul", "Div") or reader.domain not in _ONNX:
        return False
    if reader.op_type == "Div" and use.idx != 0:
        return False
    return not any(u.node.op_type == "Tanh" for u in reader.outputs[0].uses())
