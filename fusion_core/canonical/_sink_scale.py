"""Rule ``sink_scale``: attention sinks written as a scale of the context (Granite-SWA)
are the sinks' extra column of the scores (gpt-oss's spelling, the one the attention
pattern reads).

Granite-SWA's eager attention keeps the Softmax over the keys and scales each row of the
context by the share the keys leave to a learned logit ``b[n]`` per head::

    C = (Softmax(s) @ V) * Unsqueeze(Sigmoid(ReduceLogSumExp(s) - b), -1)

With ``Z = sum_k exp(s_k) = exp(ReduceLogSumExp(s))``, ``Sigmoid(lse - b) = 1 / (1 +
exp(b - lse)) = Z / (Z + exp(b))``, so each weight becomes ``exp(s_j) / (Z + exp(b))``:
the Softmax of the scores with ``b`` as one more column, that column dropped::

    C = Slice(Softmax(Concat(s, E, axis=-1)), :-1) @ V        E[., n, ., 0] = b[n]

The rewrite computes the same weights in one normalization rather than two; the check
of every job compares them. It takes only a ``b`` that is one logit per head (``[1, N,
1]``, ``[N, 1]`` or one for all), a Softmax read by this context alone and a context read
by this scale alone, so no other reader sees the new weights. Identity Casts (float to
float, as TorchScript writes ``.to(torch.float32)``) are passed. ``undo_sink_scales``
writes the scale again where no attention fusion took the sinks' column.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import (
    by_op_type,
    drop_unread,
    int64s,
    new_initializer,
    take_place,
)
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.sizes import axes_of, known_dims

__all__ = ["RULE", "sink_scales", "undo_sink_scales"]

RULE = "sink_scale"
_ONNX = ("", "ai.onnx")


def sink_scales(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every context scaled by ``Sigmoid(lse - b)`` with the sinks' column; how many."""

    def step(node: ir.Node) -> int:
        found = _scaled_context(node)
        if found is None:
            return 0
        _write_sinks(graph, fresh_name, mark, node, *found)
        return 1

    return by_op_type(graph, {"Mul": step})


def _producer(value: ir.Value | None, op_type: str) -> ir.Node | None:
    """The ONNX ``op_type`` node computing ``value`` through identity Casts, else None."""
    node = value.producer() if value is not None else None
    while node is not None and node.op_type == "Cast" and node.domain in _ONNX:
        to = node.attributes.get("to")
        source = node.inputs[0]
        if to is None or source is None or source.dtype is None or to.value != source.dtype:
            return None
        node = source.producer()
    if node is None or node.op_type != op_type or node.domain not in _ONNX:
        return None
    return node


def _only_reader(value: ir.Value, reader: ir.Node) -> bool:
    """Whether ``reader`` (through identity Casts) is all that reads ``value``."""
    while not value.is_graph_output():
        uses = list(value.uses())
        if len(uses) != 1:
            return False
        node = uses[0].node
        if node is reader:
            return True
        if node.op_type != "Cast":
            return False
        value = node.outputs[0]
    return False


def _scaled_context(mul: ir.Node) -> tuple[ir.Node, ir.Node, ir.Value] | None:
    """(the context MatMul, its Softmax, the sink logits ``b``) where ``mul`` scales the
    context by ``Unsqueeze(Sigmoid(ReduceLogSumExp(s) - b), -1)``, else None."""
    if len(mul.inputs) != 2 or None in mul.inputs:
        return None
    for side in (0, 1):
        context = _producer(mul.inputs[side], "MatMul")
        softmax = _producer(context.inputs[0], "Softmax") if context is not None else None
        if softmax is None or not _last_axis(softmax, softmax.attributes.get("axis"), -1):
            continue
        sinks = _sink_logits(mul.inputs[1 - side], softmax.inputs[0])  # type: ignore[arg-type]
        if sinks is None or not _only_reader(softmax.outputs[0], context):  # type: ignore[union-attr]
            continue
        if _only_reader(context.outputs[0], mul):  # type: ignore[union-attr]
            return context, softmax, sinks  # type: ignore[return-value]
    return None


def _last_axis(node: ir.Node, attr: ir.Attr | None, default: int) -> bool:
    dims = known_dims(node.inputs[0])
    axis = attr.value if attr is not None else default
    return dims is not None and len(dims) == 4 and axis % 4 == 3


def _sink_logits(gate: ir.Value, scores: ir.Value) -> ir.Value | None:
    """``b`` where ``gate`` is ``Unsqueeze(Sigmoid(ReduceLogSumExp(scores) - b), -1)``."""
    unsqueeze = _producer(gate, "Unsqueeze")
    if unsqueeze is None or [a % 4 for a in axes_of(unsqueeze) or [0]] != [3]:
        return None
    sigmoid = _producer(unsqueeze.inputs[0], "Sigmoid")
    sub = _producer(sigmoid.inputs[0], "Sub") if sigmoid is not None else None
    if sub is None or None in sub.inputs:
        return None
    lse = _producer(sub.inputs[0], "ReduceLogSumExp")
    if lse is None or lse.inputs[0] is not scores:
        return None
    keep = lse.attributes.get("keepdims")
    if keep is None or keep.value != 0 or [a % 4 for a in axes_of(lse) or [0]] != [3]:
        return None
    sinks = sub.inputs[1]
    dims = known_dims(sinks)
    if sinks is None or sinks.dtype != scores.dtype or dims is None or len(dims) > 3:
        return None
    per_head = [1] * (3 - len(dims)) + dims  # as it broadcasts over [B, N, S]
    if per_head[0] != 1 or per_head[2] != 1 or not isinstance(per_head[1], int):
        return None
    return sinks


def _write_sinks(
    graph: ir.Graph,
    fresh_name: Callable[[str], str],
    mark: str,
    mul: ir.Node,
    context: ir.Node,
    softmax: ir.Node,
    sinks: ir.Value,
) -> None:
    """Put ``Slice(Softmax(Concat(s, E)), :-1) @ V`` in the place of ``mul``."""
    scores = softmax.inputs[0]
    dims = list(scores.shape)  # type: ignore[union-attr]
    array = constant_array(sinks)
    column_shape = int64s(graph, fresh_name, [1, -1, 1, 1])
    if array is not None:
        logits = ir.Value(
            name=fresh_name("sink_logits"),
            shape=ir.Shape([1, array.size, 1, 1]),
            const_value=ir.tensor(array.reshape(1, -1, 1, 1)),
        )
        logits.dtype = sinks.dtype
        graph.register_initializer(logits)
        nodes: list[ir.Node] = []
    else:
        per_head = ir.Node("", "Reshape", [sinks, column_shape])
        nodes, logits = [per_head], per_head.outputs[0]
        heads = ([1, 1] + known_dims(sinks))[-2]  # type: ignore[operator]
        logits.dtype, logits.shape = sinks.dtype, ir.Shape([1, heads, 1, 1])
    shape = ir.Node("", "Shape", [scores])
    rows = ir.Node(
        "",
        "Slice",
        [shape.outputs[0], int64s(graph, fresh_name, [0]), int64s(graph, fresh_name, [3])],
    )
    target = ir.Node(
        "", "Concat", [rows.outputs[0], int64s(graph, fresh_name, [1])], [ir.AttrInt64("axis", 0)]
    )
    column = ir.Node("", "Expand", [logits, target.outputs[0]])
    joined = ir.Node("", "Concat", [scores, column.outputs[0]], [ir.AttrInt64("axis", -1)])
    weights = ir.Node("", "Softmax", [joined.outputs[0]], [ir.AttrInt64("axis", -1)])
    starts, ends, axes = (int64s(graph, fresh_name, [v]) for v in (0, -1, -1))
    kept = ir.Node("", "Slice", [weights.outputs[0], starts, ends, axes])
    product = ir.Node("", "MatMul", [kept.outputs[0], context.inputs[1]])
    nodes += [shape, rows, target, column, joined, weights, kept, product]
    _type(nodes, scores, dims)
    product.outputs[0].shape = mul.outputs[0].shape
    for node in nodes:
        node.metadata_props[mark] = RULE
    graph.insert_before(mul, nodes)
    take_place(mul.outputs[0], product.outputs[0])
    drop_unread(graph, [mul])


def _type(nodes: list[ir.Node], scores: ir.Value, dims: list) -> None:
    """Dtypes and shapes of the written nodes (shape, rows, target, column, joined,
    weights, kept, product; a Reshape of the logits first where there is one)."""
    *_, shape, rows, target, column, joined, weights, kept, product = nodes
    for node, dtype, dim_list in (
        (shape, ir.DataType.INT64, [4]),
        (rows, ir.DataType.INT64, [3]),
        (target, ir.DataType.INT64, [4]),
        (column, scores.dtype, [*dims[:3], 1]),
        (joined, scores.dtype, [*dims[:3], None]),
        (weights, scores.dtype, [*dims[:3], None]),
        (kept, scores.dtype, dims),
    ):
        node.outputs[0].dtype, node.outputs[0].shape = dtype, ir.Shape(dim_list)
    product.outputs[0].dtype = scores.dtype


def undo_sink_scales(graph: ir.Graph, mark: str) -> int:
    """Write ``(Softmax(s) @ V) * Unsqueeze(Sigmoid(ReduceLogSumExp(s) - b), -1)`` again
    in the place of each context this rule wrote and no fusion took; how many."""
    undone = 0
    for product in [n for n in graph if n.metadata_props.get(mark) == RULE]:
        if product.op_type != "MatMul" or product.graph is not graph:
            continue
        kept = product.inputs[0].producer()  # type: ignore[union-attr]
        weights = kept.inputs[0].producer() if kept is not None else None  # type: ignore[union-attr]
        joined = weights.inputs[0].producer() if weights is not None else None  # type: ignore[union-attr]
        if joined is None or any(n.metadata_props.get(mark) != RULE for n in (kept, weights)):
            continue
        scores, column = joined.inputs
        logits = column.producer().inputs[0]  # type: ignore[union-attr]
        written = _scale_again(graph, scores, logits, product.inputs[1])  # type: ignore[arg-type]
        for node in written[-2:]:  # the context and its scale: the context's shape
            node.outputs[0].shape = product.outputs[0].shape
        graph.insert_before(product, written)
        take_place(product.outputs[0], written[-1].outputs[0])
        drop_unread(graph, [product])
        undone += 1
    return undone


def _scale_again(graph: ir.Graph, scores: ir.Value, logits: ir.Value, v: ir.Value) -> list[ir.Node]:
    """The nodes of ``(Softmax(s) @ V) * Unsqueeze(Sigmoid(lse(s) - b), -1)``, ``b`` the
    ``[1, N, 1, 1]`` logits (or what the rule's Reshape read) as ``[1, N, 1]``."""
    opset = graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))
    last = new_initializer(graph, f"{scores.name}_sink_axis", [-1], ir.DataType.INT64)
    flat = new_initializer(graph, f"{scores.name}_sink_shape", [1, -1, 1], ir.DataType.INT64)
    per_row = ir.Node("", "Reshape", [logits, flat])
    keep = [ir.AttrInt64("keepdims", 0)]
    lse = (
        ir.Node("", "ReduceLogSumExp", [scores, last], keep)
        if opset >= 18
        else ir.Node("", "ReduceLogSumExp", [scores], [ir.AttrInt64s("axes", [-1]), *keep])
    )
    shifted = ir.Node("", "Sub", [lse.outputs[0], per_row.outputs[0]])
    gate = ir.Node("", "Sigmoid", [shifted.outputs[0]])
    column = (
        ir.Node("", "Unsqueeze", [gate.outputs[0], last])
        if opset >= 13
        else ir.Node("", "Unsqueeze", [gate.outputs[0]], [ir.AttrInt64s("axes", [-1])])
    )
    probs = ir.Node("", "Softmax", [scores], [ir.AttrInt64("axis", -1)])
    context = ir.Node("", "MatMul", [probs.outputs[0], v])
    scaled = ir.Node("", "Mul", [context.outputs[0], column.outputs[0]])
    nodes = [per_row, lse, shifted, gate, column, probs, context, scaled]
    for node in nodes:
        node.outputs[0].dtype = scores.dtype
    return nodes
