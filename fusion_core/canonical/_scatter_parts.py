"""Rule ``scatter_parts``: heads written part by part into an empty tensor are the
Concat of the parts.

DeepSeek-V2's and MiniCPM3's attention builds each key head in place,
``k = k_nope.new_empty(..., D); k[..., :a] = k_nope; k[..., a:] = k_pe``, which the
TorchScript exporter writes as ScatterNDs over index grids into a ConstantOfShape. A
ScatterND whose indices are the grid of its updates' shape ``[..., w]`` with the last
component ``lo .. lo + w - 1`` (the other components ``Range(0, dims[k])`` on axis ``k``,
broadcast) writes exactly the slab ``[..., lo : lo + w]``; a chain of them whose slabs
tile ``[0, D)`` without overlap overwrites every element of its first data once::

    ScatterND(ScatterND(E, grid[..., 0:a], u1), grid[..., a:D], u2) == Concat(u1, u2, axis=-1)

whatever ``E`` holds.

The dynamo exporter writes each ``copy_`` as a ``slice_scatter`` of the last axis, done
on the buffer transposed so that axis leads: with ``t`` a permutation with ``t[0]`` the
last axis (``[3, 1, 2, 0]``) and ``u`` its inverse, ``Transpose(X, t)[i] ==
X[..., i]`` laid out by ``t``, so a ScatterND whose indices are ``lo .. lo + w - 1``
(shape ``[w, 1]``: a constant, or a view of ``Range(lo, _, 1)`` sliced with step 1) and
whose updates are ``Transpose(v, t)`` writes exactly ``X[..., lo : lo + w] = v``; a chain
of them whose slabs tile ``[0, D)`` without overlap overwrites every element::

    Transpose(ScatterND(ScatterND(Transpose(E, t), [[0] .. [a-1]], Transpose(v1, t)),
                        [[a] .. [D-1]], Transpose(v2, t)), u) == Concat(v1, v2, axis=-1)

whatever ``E`` holds (an update that is no such Transpose is taken as
``Transpose(update, u)``). An element no slab writes (or one written twice) is no
part's: the chain stays, and an attention may still take the key's heads as they are.
``kt_of_heads`` splits the Transpose back off an eager attention's K^T
(``Transpose(ScatterND(..), [3, 1, 0, 2])``), so the key reads as the last line's.

The rule applies where an attention reads the result (through ``attention_reads``), so
it touches key heads, not every ScatterND.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._attention_reads import attention_reads
from autofusion.fusion_core.canonical._edits import drop_unread, replace
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import (
    Dim,
    grid_component,
    grid_parts,
    known_dims,
    scalar,
)

__all__ = ["RULE", "scatter_parts"]

RULE = "scatter_parts"
_ONNX = ("", "ai.onnx")
_VIEWS = frozenset({"Reshape", "Unsqueeze", "Identity", "Cast"})
_WALK = 8


def scatter_parts(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Make each chain of ScatterNDs an attention reads, whose slabs tile the last axis,
    a Concat of its updates; how many."""
    done = 0
    for reads in attention_reads(graph):
        reader, index = reads[1]  # the key's (K^T's input)
        value = reader.inputs[index]
        last = value.producer() if value is not None else None
        parts = _parts(graph, last, fresh_name, mark) if last is not None else None
        if parts is None or value.is_graph_output():  # type: ignore[union-attr]
            continue
        assert last is not None
        concat = ir.Node(
            "", "Concat", parts, [ir.AttrInt64("axis", -1)], name=fresh_name(f"{RULE}_Concat")
        )
        out = concat.outputs[0]
        out.name, out.dtype, out.shape = fresh_name(f"{RULE}_heads"), value.dtype, value.shape  # type: ignore[union-attr]
        written = [v.producer() for v in last.inputs if v is not None]
        replace(graph, last, [concat], mark, RULE)
        drop_unread(graph, written)
        done += 1
    return done


def _parts(
    graph: ir.Graph, last: ir.Node, fresh_name: Callable[[str], str], mark: str
) -> list[ir.Value] | None:
    """The parts whose Concat ``last``'s output is: a chain of ScatterNDs over grids
    of the last axis, or dynamo's transposed chain; else None."""
    if last.op_type == "Transpose" and last.domain in _ONNX:
        return _transposed_tiling(graph, last, fresh_name, mark)
    return _tiling(last)


def _transposed_tiling(
    graph: ir.Graph, back: ir.Node, fresh_name: Callable[[str], str], mark: str
) -> list[ir.Value] | None:
    """The parts, in the order of their slabs, of ``back = Transpose(chain, u)`` (``u``
    takes the leading axis last) where the chain of ScatterNDs writes slabs of its data's
    leading axis that tile it; else None."""
    inverse = _perm(back)
    if inverse is None or inverse[-1] != 0 or back.inputs[0] is None:
        return None
    node = back.inputs[0].producer()
    slabs: list[tuple[int, int, ir.Value]] = []
    while node is not None and _plain_scatter(node) and len(slabs) < _WALK:
        data, indices, updates = node.inputs
        slab = _leading_slab(data, indices, updates)
        if slab is None:
            return None
        slabs.append(slab)
        node = data.producer() if data is not None else None  # type: ignore[union-attr]
        if node is not None and len(node.outputs[0].uses()) != 1:
            break  # an earlier write read elsewhere: the chain starts here
    size = known_dims(back.inputs[0])
    if len(slabs) < 2 or size is None or len(size) != len(inverse) or not _tiles(slabs, size[0]):
        return None
    slabs.sort(key=lambda slab: slab[0])
    return [_untransposed(graph, u, inverse, fresh_name, mark) for _, _, u in slabs]


def _leading_slab(
    data: ir.Value | None, indices: ir.Value | None, updates: ir.Value | None
) -> tuple[int, int, ir.Value] | None:
    """``(lo, lo + w, updates)`` where the ScatterND writes rows ``lo .. lo + w - 1`` of
    its data's leading axis: indices ``[w, 1]`` of consecutive positions (ScatterND's
    updates are then ``[w, *data.shape[1:]]``, whatever names an inference gave their
    sizes)."""
    dims, index_dims = known_dims(data), known_dims(indices)
    if dims is None or index_dims is None or updates is None:
        return None
    if len(index_dims) != 2 or index_dims[1] != 1 or not isinstance(index_dims[0], int):
        return None
    start = _start(indices)
    return None if start is None or start < 0 else (start, start + index_dims[0], updates)


def _tiles(slabs: list[tuple[int, int, ir.Value]], size: Dim) -> bool:
    """Whether the slabs ``[lo, hi)`` cover ``[0, size)`` once each."""
    if not isinstance(size, int):
        return False
    ordered = sorted(slabs, key=lambda slab: slab[0])
    ends = [0] + [end for _, end, _ in ordered]
    if any(start != end for (start, _, _), end in zip(ordered, ends, strict=False)):
        return False
    return ends[-1] == size


def _untransposed(
    graph: ir.Graph,
    update: ir.Value,
    inverse: list[int],
    fresh_name: Callable[[str], str],
    mark: str,
) -> ir.Value:
    """``v`` for an update ``Transpose(v, t)`` with ``t[inverse]`` the identity; else
    ``Transpose(update, inverse)``, inserted after the update."""
    producer = update.producer()
    turn = _perm(producer) if producer is not None and producer.op_type == "Transpose" else None
    undone = turn is not None and [turn[i] for i in inverse] == list(range(len(inverse)))
    if undone and producer.inputs[0] is not None:  # type: ignore[union-attr]
        return producer.inputs[0]  # type: ignore[union-attr]
    node = ir.Node(
        "", "Transpose", [update], [ir.AttrInt64s("perm", inverse)], name=fresh_name(RULE)
    )
    dims = list(update.shape) if update.shape is not None else None
    out = node.outputs[0]
    out.name, out.dtype = fresh_name(f"{RULE}_part"), update.dtype
    out.shape = ir.Shape([dims[i] for i in inverse]) if dims else None
    node.metadata_props[mark] = RULE
    if producer is not None:
        graph.insert_after(producer, [node])
    else:
        graph.insert_before(next(iter(graph)), [node])
    return out


def _perm(node: ir.Node) -> list[int] | None:
    perm = attribute_value(node, "perm", None)
    return list(perm) if perm is not None else None


def _tiling(last: ir.Node) -> list[ir.Value] | None:
    """The updates of the ScatterND chain ending in ``last``, in the order of their
    slabs, where the slabs tile the last axis of its data; else None."""
    slabs: list[tuple[int, int, ir.Value]] = []
    node: ir.Node | None = last
    data_dims: list[Dim] | None = None
    while node is not None and _plain_scatter(node) and len(slabs) < _WALK:
        data, indices, updates = node.inputs
        dims, written = known_dims(data), known_dims(updates)
        if dims is None or written is None or len(dims) != len(written) or None in written:
            return None
        if written[:-1] != dims[:-1] or not isinstance(written[-1], int):
            return None
        start = _slab_start(indices, written)  # type: ignore[arg-type]
        if start is None:
            return None
        slabs.append((start, start + written[-1], updates))  # type: ignore[arg-type]
        data_dims = dims
        node = data.producer() if data is not None else None  # type: ignore[union-attr]
        if node is not None and len(node.outputs[0].uses()) != 1:
            break  # an earlier write read elsewhere: the chain starts here
    if len(slabs) < 2 or data_dims is None or not isinstance(data_dims[-1], int):
        return None
    slabs.sort(key=lambda slab: slab[0])
    ends = [0] + [end for _, end, _ in slabs]
    if any(start != end for (start, _, _), end in zip(slabs, ends, strict=False)):
        return None
    return [u for _, _, u in slabs] if ends[-1] == data_dims[-1] else None


def _plain_scatter(node: ir.Node) -> bool:
    return (
        node.op_type == "ScatterND"
        and node.domain in _ONNX
        and len(node.inputs) == 3
        and attribute_value(node, "reduction", "none") in ("none", b"none")
    )


def _slab_start(indices: ir.Value | None, dims: list[Dim]) -> int | None:
    """``lo`` where ``indices`` is the grid of ``dims`` with the last component
    ``lo .. lo + dims[-1] - 1``: a Concat on a new last axis of ``Unsqueeze(Expand(v),
    -1)`` parts, ``v`` the axis's positions, else None."""
    parts = grid_parts(indices, dims)
    if parts is None:
        return None
    starts = [_component_start(part, k, dims) for k, part in enumerate(parts)]
    return starts[-1] if all(s == 0 for s in starts[:-1]) else None


def _component_start(part: ir.Value | None, axis: int, dims: list[Dim]) -> int | None:
    """The first position of a grid component (``grid_component``): its values are
    consecutive positions along ``axis``."""
    values = grid_component(part, axis, dims)
    return _start(values) if values is not None else None


def _start(value: ir.Value | None) -> int | None:
    """The first of the consecutive positions ``value`` holds: a constant, a view of
    ``Range(lo, _, 1)``, or a Slice from ``s`` with step 1 of such positions."""
    for _ in range(_WALK):
        array = constant_array(value)
        if array is not None:
            flat = array.reshape(-1)
            consecutive = flat.size and array.dtype.kind in "iu" and np.all(np.diff(flat) == 1)
            return int(flat[0]) if consecutive else None
        producer = value.producer() if value is not None else None
        if producer is None:
            return None
        if producer.op_type == "Range":
            return scalar(producer.inputs[0]) if scalar(producer.inputs[2]) == 1 else None
        if producer.op_type == "Slice":
            return _slice_start(producer)
        if producer.op_type not in _VIEWS:
            return None
        value = producer.inputs[0]
    return None


def _slice_start(node: ir.Node) -> int | None:
    """``lo + s`` for a 1-D Slice from ``s >= 0`` with step 1 of positions from ``lo``."""
    source = node.inputs[0]
    starts = scalar(node.inputs[1]) if len(node.inputs) > 1 else None
    axes = scalar(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else 0
    step = scalar(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else 1
    if starts is None or starts < 0 or axes not in (0, -1) or step != 1:
        return None
    if source is None or source.shape is None or len(source.shape) != 1:
        return None
    first = _start(source)
    return None if first is None else first + starts
