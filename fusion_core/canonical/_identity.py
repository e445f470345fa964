"""Rules ``identity_reshape`` and ``identity_slice``: a Reshape to its input's own shape,
and a Slice (forward steps) that keeps its input's whole shape, are no ops.

Exporters write them where the source reshapes "to the same view" (Falcon's
``transpose(1, 2).reshape(batch, heads, q_len, head_dim)``, SDPA's reshape of
``P @ V``), from shapes read at run time, so constant folding keeps them, and every
pattern through that place would need a copy with the Reshape and one without. Where
every dimension of the input and the output is known and the same (a number, or the
same symbol: the shape inference gives one symbol to dimensions it proved equal), the
readers read the input instead.

The Slice is the eager attention's ``causal_mask[:, :, :, : key.shape[-2]]`` of a mask
built as long as the keys already (optimum's KV-cache exports): with the Slice between
them the mask's builder (``Where(allowed, 0, lowest)``) is hidden from the rewriter
that reads it. A Slice whose steps are all forward (absent, or constant and positive)
and whose output has the input's known shape picks every element in order.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._head_split import MERGE, SPLIT
from autofusion.fusion_core.ir import constant_array

__all__ = ["drop_identity_reshapes", "drop_identity_slices"]

_ONNX = ("", "ai.onnx")


def drop_identity_reshapes(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Bypass every Reshape proven to keep its input's shape, and every Reshape of a
    Reshape that gives back the first one's input shape; how many."""
    del fresh_name  # it inserts nothing
    return _bypass(graph, lambda node: node.op_type == "Reshape") + _bypass_pairs(graph, mark)


def _bypass_pairs(graph: ir.Graph, mark: str) -> int:
    """A Reshape keeps the row-major order of the elements, so two in a row that end in
    the first one's input shape give back that input: here the fold of the heads into
    the batch and its unfold (``[B, N, S, H]`` to ``[B * N, S, H]`` and back, what
    ``heads_in_batch`` leaves between a Softmax and a product). Other pairs stay: the
    merge/split pairs ``head_split`` inserts on purpose (marked), and the steps of
    spellings later rules read whole (dynamo's K^T through a 3-D Reshape)."""
    dropped = 0
    for node in list(graph):
        if node.graph is not graph or node.op_type != "Reshape" or node.domain not in _ONNX:
            continue
        inner = node.inputs[0].producer() if node.inputs[0] is not None else None
        if inner is None or inner.op_type != "Reshape" or inner.domain not in _ONNX:
            continue
        if {node.metadata_props.get(mark), inner.metadata_props.get(mark)} & {MERGE, SPLIT}:
            continue
        source, out = inner.inputs[0], node.outputs[0]
        if source is None or out.is_graph_output() or not _same_known_dims(source, out):
            continue
        if len(source.shape) != 4 or inner.outputs[0].shape is None:  # type: ignore[arg-type]
            continue  # only the heads' fold [B, N, S, H] -> [B * N, S, H] and its unfold:
        if len(inner.outputs[0].shape) != 3:  # other pairs are steps later rules read
            continue
        out.replace_all_uses_with(source)
        graph.remove(node, safe=True)
        if not inner.outputs[0].uses() and not inner.outputs[0].is_graph_output():
            graph.remove(inner, safe=True)
        dropped += 1
    return dropped


def drop_identity_slices(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Bypass every forward Slice proven to keep its input's shape; how many."""
    del fresh_name, mark
    return _bypass(graph, _forward_slice)


def _forward_slice(node: ir.Node) -> bool:
    if node.op_type != "Slice" or len(node.inputs) < 3:
        return False  # before opset 10 the bounds are attributes: not exported any more
    if len(node.inputs) < 5 or node.inputs[4] is None:
        return True
    steps = constant_array(node.inputs[4])
    return steps is not None and bool(np.all(steps > 0))


def _bypass(graph: ir.Graph, kind: Callable[[ir.Node], bool]) -> int:
    dropped = 0
    for node in list(graph):
        if node.domain not in _ONNX or not kind(node):
            continue
        source, out = node.inputs[0], node.outputs[0]
        if source is None or out.is_graph_output() or not _same_known_dims(source, out):
            continue
        out.replace_all_uses_with(source)
        graph.remove(node, safe=True)
        dropped += 1
    return dropped


def _same_known_dims(a: ir.Value, b: ir.Value) -> bool:
    if a.shape is None or b.shape is None or len(a.shape) != len(b.shape):
        return False
    for x, y in zip(a.shape, b.shape, strict=True):
        x = x if isinstance(x, int) else x.value
        y = y if isinstance(y, int) else y.value
        if x is None or x != y:
            return False
    return True
