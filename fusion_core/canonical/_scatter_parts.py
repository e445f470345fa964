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

whatever ``E`` holds. The rule applies where an attention reads the result (through
``attention_reads``), so it touches key heads, not every ScatterND.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._attention_reads import attention_reads
from autofusion.fusion_core.canonical._edits import drop_unread, replace
from autofusion.fusion_core.canonical._shape_values import (
    Dim,
    grid_component,
    grid_parts,
    known_dims,
    scalar,
)
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value

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
        parts = _tiling(last) if last is not None else None
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
