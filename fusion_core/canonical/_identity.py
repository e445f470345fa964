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
that reads it. A Slice is proven whole by its own bounds (start 0, step 1, an end that
is the input's own size on each axis it names), never by the shape inferred for its
output (``_whole_slice`` says why).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._head_split import MERGE, SPLIT
from autofusion.fusion_core.canonical._shape_values import entries
from autofusion.fusion_core.sizes import Size, axis_size, read_sizes

__all__ = ["drop_identity_reshapes", "drop_identity_slices"]

_ONNX = ("", "ai.onnx")
_WHOLE = 2**31 - 1  # an end this large is "to the end" (torch writes INT64_MAX)


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
    """Bypass every Slice proven whole by its own bounds; how many."""
    del fresh_name, mark
    return _bypass(graph, _whole_slice, compare_shapes=False)


def _whole_slice(node: ir.Node) -> bool:
    """Whether the Slice picks every element of its input in order, proven from its
    bounds: on every axis it names, step 1 (or none), start 0, and an end at least the
    input's size there: a constant as large, or a size the graph proves at least as
    large (``fusion_core.sizes``: read from the shape of a value whose size there the
    graph ties to the input's, through the ops in between).

    Not from an inferred shape, the output's or the input's: where onnxruntime's
    symbolic inference cannot decide ``end <= dim`` it treats them as equal, and it
    merges symbols it cannot compare ("auto merge": Kimi-Linear's padded length read as
    ``sequence``), so a Slice that cuts a padded length back (``rows[:, :, :S]`` of
    ``P >= S`` rows) would read as keeping its input."""
    if node.op_type != "Slice" or len(node.inputs) < 3:
        return False  # before opset 10 the bounds are attributes: not exported any more
    source = node.inputs[0]
    starts, ends = entries(node.inputs[1]), read_sizes(node.inputs[2])
    if source is None or source.shape is None or starts is None or ends is None:
        return False
    if len(starts) != len(ends):
        return False
    rank = len(source.shape)
    axes = entries(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    axes = list(range(len(starts))) if axes is None and len(node.inputs) <= 3 else axes
    steps = entries(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else None
    if axes is None or len(axes) != len(starts) or (steps is not None and set(steps) != {1}):
        return False
    for axis, start, end in zip(axes, starts, ends, strict=True):
        if axis is None or not -rank <= axis < rank or start != 0:
            return False
        if not _reaches(end, axis_size(source, axis)):
            return False
    return True


def _reaches(end: Size | None, size: Size | None) -> bool:
    """Whether a Slice's ``end`` is at least the input's proven ``size`` on its axis."""
    if end is None:
        return False
    if end.value is not None and end.value >= _WHOLE:
        return True
    if size is None or end.atoms != size.atoms:
        return False
    return end.constant >= size.constant


def _bypass(
    graph: ir.Graph, kind: Callable[[ir.Node], bool], *, compare_shapes: bool = True
) -> int:
    dropped = 0
    for node in list(graph):
        if node.domain not in _ONNX or not kind(node):
            continue
        source, out = node.inputs[0], node.outputs[0]
        if source is None or out.is_graph_output():
            continue
        if compare_shapes and not _same_known_dims(source, out):
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
