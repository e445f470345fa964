"""Rules ``gather_nd_as_slice``, ``slice_before_transpose_of_one`` and
``transposes_composed``: one head picked out of a permuted projection reads as a slice
of the head split.

The dynamo exporter writes Falcon's ``fused_qkv[..., -2, :]`` (its one key head) as

    Transpose(GatherND(Transpose(Reshape(qkv, [B, S, N + 2, H]), [2, 0, 1, 3]), [[N]]),
              [1, 0, 2, 3])

Three steps, each picking the same elements in the same order, turn that into
``Transpose(Slice(Reshape(qkv), N, N + 1, axis 2), [0, 2, 1, 3])``, which
``heads_by_slice`` already makes a head split of its own:

* ``gather_nd_as_slice``: ``GatherND(data, [[j]])`` (``batch_dims`` 0, one constant
  index of the first axis) is ``Slice(data, j, j + 1, axis 0)``;
* ``slice_before_transpose_of_one``: a Slice of one axis ``a`` of ``Transpose(x, p)``
  is the Transpose of the Slice of axis ``p[a]`` of ``x`` (where only such Slices read
  the Transpose, so that it goes);
* ``transposes_composed``: ``Transpose(Transpose(x, p), q)`` is ``Transpose(x, p[q])``
  (none at all where that is the identity), where that is the head layout
  ``[0, 2, 1, 3]`` or the identity: K^T's ``Transpose(heads, [0, 1, 3, 2])`` stays a
  Transpose of the head Transpose, which the attention patterns read.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s, replace
from autofusion.fusion_core.ir import constant_array

__all__ = ["compose_transposes", "gather_nd_as_slices", "slices_before_transposes"]

_ONNX = ("", "ai.onnx")
_HEAD_PERM = [0, 2, 1, 3]


def gather_nd_as_slices(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Make every GatherND of one constant first-axis index a Slice; how many."""
    done = 0
    if _opset(graph) < 10:
        return 0
    for node in list(graph):
        index = _single_first_axis_index(node)
        if index is None:
            continue
        bounds = [int64s(graph, fresh_name, [v]) for v in (index, index + 1, 0)]
        sliced = ir.Node("", "Slice", [node.inputs[0], *bounds], name=fresh_name("gather_nd_Slice"))
        _take_place(graph, node, [sliced], mark, "gather_nd_as_slice", fresh_name)
        done += 1
    return done


def slices_before_transposes(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Move every one-axis Slice of a Transpose that only such Slices read above it;
    how many."""
    done = 0
    for node in list(graph):
        found = _slice_of_transpose(node)
        if found is None:
            continue
        transpose, axis = found
        perm = list(transpose.attributes["perm"].value)
        source = transpose.inputs[0]
        axes = int64s(graph, fresh_name, [perm[axis]])
        early = ir.Node(
            "",
            "Slice",
            [source, node.inputs[1], node.inputs[2], axes, *node.inputs[4:]],
            name=fresh_name(f"{node.name or 'Slice'}_early"),
        )
        early.outputs[0].dtype = source.dtype  # type: ignore[union-attr]
        early.outputs[0].name = fresh_name("slice_before_transpose_part")
        if node.outputs[0].shape is not None:
            inverse = np.argsort(perm)
            early.outputs[0].shape = ir.Shape([node.outputs[0].shape[i] for i in inverse])
        late = ir.Node(
            "",
            "Transpose",
            [early.outputs[0]],
            [ir.AttrInt64s("perm", perm)],
            name=fresh_name(f"{transpose.name or 'Transpose'}_late"),
        )
        _take_place(graph, node, [early, late], mark, "slice_before_transpose_of_one", fresh_name)
        if not transpose.outputs[0].uses():  # its last Slice moved
            graph.remove(transpose, safe=True)
        done += 1
    return done


def compose_transposes(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Make every Transpose of a Transpose it alone reads one, where the two compose to
    the head layout or to nothing; how many."""
    done = 0
    for outer in list(graph):
        inner = _inner_transpose(outer)
        if inner is None:
            continue
        first = list(inner.attributes["perm"].value)
        second = list(outer.attributes["perm"].value)
        composed = [first[i] for i in second]
        if composed not in (list(range(len(composed))), _HEAD_PERM):
            continue  # K^T's Transpose of the heads stays: the patterns read both
        source = inner.inputs[0]
        if composed == list(range(len(composed))):
            outer.outputs[0].replace_all_uses_with(source)  # type: ignore[arg-type]
            graph.remove(outer, safe=True)
        else:
            one = ir.Node(
                "",
                "Transpose",
                [source],
                [ir.AttrInt64s("perm", composed)],
                name=fresh_name(f"{outer.name or 'Transpose'}_composed"),
            )
            _take_place(graph, outer, [one], mark, "transposes_composed", fresh_name)
        graph.remove(inner, safe=True)
        done += 1
    return done


def _single_first_axis_index(node: ir.Node) -> int | None:
    if node.op_type != "GatherND" or node.domain not in _ONNX or len(node.inputs) != 2:
        return None
    batch_dims = node.attributes.get("batch_dims")
    indices = constant_array(node.inputs[1])
    data = node.inputs[0]
    if (batch_dims is not None and batch_dims.value != 0) or indices is None:
        return None
    if indices.shape != (1, 1) or data is None or data.shape is None:
        return None
    size = data.shape[0]
    index = int(indices.reshape(-1)[0])
    if index < 0:
        if not isinstance(size, int):
            return None
        index += size
    if index < 0 or (isinstance(size, int) and index >= size):
        return None
    return index


def _slice_of_transpose(node: ir.Node) -> tuple[ir.Node, int] | None:
    """(the Transpose, the sliced axis) of a one-axis Slice of a Transpose that only
    such Slices read (Falcon's key and value heads both are)."""
    if _slice_axis(node) is None:
        return None
    source = node.inputs[0]
    transpose = source.producer() if source is not None else None
    if transpose is None or transpose.op_type != "Transpose" or transpose.domain not in _ONNX:
        return None
    perm = transpose.attributes.get("perm")
    readers = [use.node for use in source.uses()]  # type: ignore[union-attr]
    if perm is None or not all(_slice_axis(r) is not None for r in readers):
        return None
    rank = len(perm.value)
    axis = _slice_axis(node)
    axis = axis + rank if axis < 0 else axis  # type: ignore[operator]
    if not 0 <= axis < rank or node.outputs[0].is_graph_output():
        return None
    if any(_joined_on(r, rank) for r in readers):
        return None  # parts joined back as they are: a partial rotary's (Phi), stays whole
    return transpose, axis


def _joined_on(node: ir.Node, rank: int) -> bool:
    """Whether a Concat on the axis ``node`` slices reads one of its outputs."""
    axis = _slice_axis(node)
    axis = axis + rank if axis is not None and axis < 0 else axis
    for out in node.outputs:
        for use in out.uses():
            concat = use.node
            if concat.op_type != "Concat" or concat.domain not in _ONNX:
                continue
            joined = concat.attributes.get("axis")
            value = joined.value if joined is not None else None
            if value is not None and (value + rank if value < 0 else value) == axis:
                return True
    return False


def _slice_axis(node: ir.Node) -> int | None:
    """The one constant axis a Slice cuts, else None."""
    if node.op_type != "Slice" or node.domain not in _ONNX or len(node.inputs) < 4:
        return None
    axes = constant_array(node.inputs[3])
    return int(axes.reshape(-1)[0]) if axes is not None and axes.size == 1 else None


def _inner_transpose(outer: ir.Node) -> ir.Node | None:
    if outer.op_type != "Transpose" or outer.domain not in _ONNX or outer.inputs[0] is None:
        return None
    inner = outer.inputs[0].producer()
    if inner is None or inner.op_type != "Transpose" or inner.domain not in _ONNX:
        return None
    if "perm" not in inner.attributes or "perm" not in outer.attributes:
        return None
    if len(outer.inputs[0].uses()) != 1 or outer.outputs[0].is_graph_output():
        return None
    return inner


def _take_place(
    graph: ir.Graph,
    old: ir.Node,
    new: list[ir.Node],
    mark: str,
    rule: str,
    fresh_name: Callable[[str], str],
) -> None:
    """``replace``, the last new output named and typed as ``old``'s."""
    out, last = old.outputs[0], new[-1].outputs[0]
    last.name = fresh_name(out.name or rule)
    last.dtype, last.shape = out.dtype, out.shape
    replace(graph, old, new, mark, rule)


def _opset(graph: ir.Graph) -> int:
    return graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))
