"""Rule ``packed_heads``: q, k and v picked from one projection viewed as ``[B, S, P, N,
H]`` (P parts of N heads of H features: ModernBERT's ``Wqkv(x).view(B, S, 3, N, H)``,
other fused projections the same way) are each a head split of their own part.

The exporters pick part ``i`` of that view by ``Squeeze(Split(r, axis)[i], axis)``, by
``Gather(r, i, axis)`` with a scalar index, or by ``Squeeze(Slice(r, i, i + 1, axis),
axis)``. Row-major, the last axis of the projection is laid out as ``(P, N, H)``, so
part ``i`` is the features ``[i * N * H, (i + 1) * N * H)``::

    pick_i(Reshape(x, [B, S, P, N, H]))  =  Reshape(Slice(x, i*N*H, (i+1)*N*H, -1), [0, 0, N, H])

exactly (the same elements in the same order), which is the head split every attention
pattern reads. The leading dimensions are copied (0 entries), so the view must keep
them: the Reshape's output has the input's leading dimensions, known.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s, replace
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import axes_of, known_dims

__all__ = ["RULE", "packed_heads"]

RULE = "packed_heads"
_ONNX = ("", "ai.onnx")


def packed_heads(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every part picked from a ``[.., P, N, H]`` view of one projection as its own
    head split; how many."""
    done = 0
    for node in list(graph):
        found = _picked_part(node)
        if found is None:
            continue
        projection, (start, stop), heads = found
        lead = len(known_dims(projection) or []) - 1
        ints = [int64s(graph, fresh_name, [v]) for v in (start, stop, -1)]
        part = ir.Node("", "Slice", [projection, *ints], name=fresh_name(f"{RULE}_Slice"))
        split = ir.Node(
            "", "Reshape", [part.outputs[0], int64s(graph, fresh_name, [0] * lead + heads)],
            name=fresh_name(f"{RULE}_Reshape"),
        )  # fmt: skip
        part.outputs[0].shape = ir.Shape([*projection.shape[:-1], stop - start])  # type: ignore[index]
        split.outputs[0].shape = ir.Shape([*projection.shape[:-1], *heads])  # type: ignore[index]
        for made, hint in ((part, "part"), (split, "heads")):
            made.outputs[0].dtype = projection.dtype
            made.outputs[0].name = fresh_name(f"{RULE}_{hint}")
        picker = node.inputs[0].producer() if node.inputs[0] is not None else None
        replace(graph, node, [part, split], mark, RULE)
        _drop_unread(graph, picker)
        done += 1
    return done


def _picked_part(node: ir.Node) -> tuple[ir.Value, tuple[int, int], list[int]] | None:
    """(the projection, its features of the part, [N, H]) when ``node`` picks one part
    of a ``[.., P, N, H]`` view of it, else None."""
    if node.domain not in _ONNX or node.outputs[0].is_graph_output():
        return None
    if node.op_type == "Gather":
        index = constant_array(node.inputs[1])
        if index is None or index.ndim != 0:
            return None  # a 1-element index keeps the axis: not a pick
        view, axis, picked = node.inputs[0], attribute_value(node, "axis", 0), int(index)
    elif node.op_type == "Squeeze":
        found = _split_or_slice(node)
        if found is None:
            return None
        view, axis, picked = found
    else:
        return None
    return _part_of(view, axis, picked)


def _split_or_slice(squeeze: ir.Node) -> tuple[ir.Value, int, int] | None:
    """(view, axis, i) for ``Squeeze(Split(view, axis)[i], axis)`` with parts of one
    element, or ``Squeeze(Slice(view, i, i + 1, axis), axis)``."""
    source = squeeze.inputs[0]
    producer = source.producer() if source is not None else None
    axes = axes_of(squeeze)
    if producer is None or producer.domain not in _ONNX or axes is None or len(axes) != 1:
        return None
    if producer.op_type == "Split":
        axis = attribute_value(producer, "axis", 0)
        dims = known_dims(producer.inputs[0])
        if dims is None or not -len(dims) <= axis < len(dims):
            return None
        sizes = constant_array(producer.inputs[1]) if len(producer.inputs) > 1 else None
        count = dims[axis]
        if sizes is not None and not np.all(sizes == 1):
            return None
        if sizes is None and count != len(producer.outputs):
            return None
        picked = list(producer.outputs).index(source)  # type: ignore[arg-type]
    elif producer.op_type == "Slice":
        found = _unit_slice(producer)
        if found is None:
            return None
        axis, picked = found
    else:
        return None
    rank = len(known_dims(producer.inputs[0]) or [])
    if rank == 0 or axes[0] % rank != axis % rank:
        return None
    return producer.inputs[0], axis, picked  # type: ignore[return-value]


def _unit_slice(node: ir.Node) -> tuple[int, int] | None:
    """(axis, i) of ``Slice(x, [i], [i + 1], [axis])`` with step 1."""
    bounds = [constant_array(v) if v is not None else None for v in node.inputs[1:5]]
    if len(bounds) < 3 or any(b is None or b.size != 1 for b in bounds[:3]):
        return None
    start, stop, axis = (int(b.reshape(-1)[0]) for b in bounds[:3])  # type: ignore[union-attr]
    if len(bounds) > 3 and bounds[3] is not None and int(bounds[3].reshape(-1)[0]) != 1:
        return None
    if start < 0 or stop != start + 1:
        return None
    return axis, start


def _part_of(view: ir.Value | None, axis: int, picked: int):
    """The projection, features and [N, H] of part ``picked`` of ``view`` on ``axis``,
    where ``view = Reshape(projection, [.., P, N, H])`` keeps the leading dimensions."""
    reshape = view.producer() if view is not None else None
    if reshape is None or reshape.op_type != "Reshape" or reshape.domain not in _ONNX:
        return None
    projection = reshape.inputs[0]
    dims, parts = known_dims(projection), known_dims(view)
    if dims is None or parts is None or len(parts) != len(dims) + 2 or len(dims) < 2:
        return None
    if axis % len(parts) != len(parts) - 3:
        return None  # the parts axis is the third from the end
    count, heads, size = parts[-3:]
    lead = dims[:-1]
    if not all(isinstance(d, int) for d in (count, heads, size)) or None in lead:
        return None
    if parts[:-3] != lead or dims[-1] != count * heads * size or not -count <= picked < count:
        return None
    picked %= count
    width = heads * size
    return projection, (picked * width, (picked + 1) * width), [heads, size]


def _drop_unread(graph: ir.Graph, node: ir.Node | None) -> None:
    """Remove the Split (or Slice) and the view the last pick of them left unread."""
    while node is not None and node.graph is graph:
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            return
        source = node.inputs[0].producer() if node.inputs[0] is not None else None
        graph.remove(node, safe=True)
        node = source if source is not None and source.op_type == "Reshape" else None
