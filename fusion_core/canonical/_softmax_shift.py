"""Rule ``softmax_shift``: ``Softmax(x - ReduceMax(x))`` over the same axis is
``Softmax(x)``.

gpt-oss's eager attention appends a learned logit per head (the attention sink) as one
more column of the scores and subtracts each row's max before the Softmax
(``combined - combined.max(dim=-1, keepdim=True).values``, against overflow in bf16)::

    P = Slice(Softmax(Concat(s, sink) - ReduceMax(Concat(s, sink))), :-1)

Softmax subtracts the row's max itself (https://onnx.ai/onnx/operators/onnx__Softmax.html:
``exp(x - max(x)) / sum(exp(x - max(x)))``), so a shift by any per-row constant leaves
it unchanged; here the shifted row's max is ``m - m = 0`` exactly, and the kernel then
exponentiates the same ``x_i - m`` the unshifted Softmax would: equal bit for bit. With
the shift gone the sink's form is the one the attention pattern reads
(``Slice(Softmax(Concat(s, sink)), :-1)``, its optional group ``sink``).

``appends_sink_column`` lets the rules that follow scores (or a mask) to the Softmax
that reads them pass the sinks' Concat.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread
from autofusion.fusion_core.sizes import axes_of, known_dims

__all__ = ["appends_sink_column", "softmax_shifts_dropped"]

_ONNX = ("", "ai.onnx")


def softmax_shifts_dropped(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Let every Softmax of ``x - ReduceMax(x)`` read ``x``; how many."""
    del fresh_name, mark  # it inserts nothing
    dropped = 0
    for node in list(graph):
        if node.op_type != "Softmax" or node.domain not in _ONNX or node.graph is not graph:
            continue
        shifted = _shifted(node)
        if shifted is None:
            continue
        source, shift = shifted
        node.replace_input_with(0, source)
        drop_unread(graph, [shift])
        dropped += 1
    return dropped


def _shifted(softmax: ir.Node) -> tuple[ir.Value, ir.Node] | None:
    """(x, the Sub) where the Softmax reads ``Sub(x, ReduceMax(x, its axis, keepdims))``."""
    value = softmax.inputs[0] if softmax.inputs else None
    sub = value.producer() if value is not None else None
    if sub is None or sub.op_type != "Sub" or sub.domain not in _ONNX or None in sub.inputs:
        return None
    source, peak = sub.inputs
    reduce = peak.producer()  # type: ignore[union-attr]
    dims = source.shape  # type: ignore[union-attr]
    if reduce is None or reduce.op_type != "ReduceMax" or reduce.inputs[0] is not source:
        return None
    if dims is None or peak.shape is None or len(peak.shape) != len(dims):  # type: ignore[union-attr]
        return None  # keepdims = 0 would broadcast along another axis
    rank = len(dims)
    attr = softmax.attributes.get("axis")
    opset = softmax.graph.opset_imports.get("", 0) if softmax.graph is not None else 0
    axis = attr.value if attr is not None else (-1 if opset >= 13 else 1)
    axes = axes_of(reduce)
    # the last axis only: before opset 13 Softmax flattens the axes from ``axis`` on
    if axis % rank != rank - 1 or axes is None or [a % rank for a in axes] != [rank - 1]:
        return None
    keep = reduce.attributes.get("keepdims")
    if keep is not None and keep.value == 0:
        return None
    return source, sub  # type: ignore[return-value]


def appends_sink_column(node: ir.Node, value: ir.Value) -> bool:
    """Whether ``node`` appends one column to ``value`` on its last axis (the attention
    sinks' Concat): the values it reads still reach the Softmax after it as they are."""
    if node.op_type != "Concat" or node.domain not in _ONNX or len(node.inputs) != 2:
        return False
    dims, column = value.shape, known_dims(node.inputs[1])
    if node.inputs[0] is not value or dims is None or column is None:
        return False
    attr = node.attributes.get("axis")
    axis = attr.value if attr is not None else 0
    rank = len(dims)
    return len(column) == rank and column[-1] == 1 and axis % rank == rank - 1
