"""Readers of entries: the values of small integer tensors a graph computes from
shapes (``Concat`` of ``Shape`` reads, ``Gather``, ``Slice``, sums, products by numbers),
as sizes."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array, constant_picks
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes._size import Size, arithmetic

if TYPE_CHECKING:
    from autofusion.fusion_core.sizes._proof import Entries, SizeProof

__all__ = ["READERS", "VIEWS", "to_int", "unknown"]

VIEWS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten"})


def to_int(node: ir.Node) -> bool:
    return attribute_value(node, "to", 0) in (ir.DataType.INT64, ir.DataType.INT32)


def unknown(value: ir.Value) -> Entries | None:
    if value.shape is None or not value.shape.is_static():
        return None
    count = 1
    for d in value.shape:
        count *= int(d)
    return [None] * count


def _shape_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    source = node.inputs[0]
    if source is None or source.shape is None:
        return None
    rank = len(source.shape)
    start = attribute_value(node, "start", 0) or 0
    end = attribute_value(node, "end", None)
    axes = range(rank)[start:end] if end is not None else range(rank)[start:]
    return [proof.size(source, a, depth) for a in axes]


def _concat_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    parts = [proof.entries(v, depth) for v in node.inputs]
    if any(p is None for p in parts):
        return None
    return [e for p in parts for e in p]  # type: ignore[union-attr]


def _gather_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    data = proof.entries(node.inputs[0], depth)
    if data is None or attribute_value(node, "axis", 0) != 0:
        return None
    return constant_picks(data, node.inputs[1])


def _slice_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    """A 1-D Slice with constant bounds (axis 0, any step) of entries."""
    data = proof.entries(node.inputs[0], depth)
    bounds = [constant_array(v) for v in node.inputs[1:5]]
    bounds += [None] * (4 - len(bounds))
    starts, ends, axes, steps = bounds
    if data is None or starts is None or ends is None or starts.size != 1 or ends.size != 1:
        return None
    if axes is not None and axes.reshape(-1).tolist() not in ([0], [-1]):
        return None
    step = int(steps.reshape(-1)[0]) if steps is not None and steps.size == 1 else None
    step = 1 if steps is None else step
    if not step:
        return None
    picked = range(len(data))[slice(int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0]), step)]
    return [data[i] for i in picked]


def _add_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    a, b = (proof.entries(v, depth) for v in node.inputs[:2])
    if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
        return None
    n = max(len(a), len(b))
    pairs = [(a[i % len(a)], b[i % len(b)]) for i in range(n)]
    return [x + y if x is not None and y is not None else None for x, y in pairs]


def _where_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    """``Where(Equal(s, c), a, s)`` entry by entry (torch's ``expand(-1)`` target, ``c``
    -1): ``a``'s entry where ``s``'s is the number ``c``'s, ``s``'s where it cannot be
    (a size is never negative); undecided otherwise."""
    condition = node.inputs[0].producer() if node.inputs[0] is not None else None
    if (
        condition is None
        or condition.op_type != "Equal"
        or node.inputs[2] is not condition.inputs[0]
    ):
        return None
    against = constant_array(condition.inputs[1])
    chosen, other = proof.entries(node.inputs[2], depth), proof.entries(node.inputs[1], depth)
    if against is None or chosen is None or other is None or against.dtype.kind not in "iu":
        return None
    n = len(chosen)
    if {len(other), against.size} - {1, n}:
        return None
    flat = against.reshape(-1)
    return [_pick(chosen[i], other[i % len(other)], int(flat[i % flat.size])) for i in range(n)]


def _pick(entry: Size | None, instead: Size | None, against: int) -> Size | None:
    if entry is None:
        return None
    if entry.value is not None:
        return instead if entry.value == against else entry
    return entry if against < 0 and entry.constant >= 0 else None


def _arithmetic_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    """``Mul`` or ``Div`` of entries by numbers (``heads * n_rep``, ``dim // 2`` exact), or
    ``Sub`` of entries whose symbols the first holds."""
    a, b = (proof.entries(v, depth) for v in node.inputs[:2])
    if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
        return None
    n = max(len(a), len(b))
    return [arithmetic(node.op_type, a[i % len(a)], b[i % len(b)]) for i in range(n)]


def _scatter_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    """A 1-D ``ScatterElements`` (no reduction) of entries at constant indices."""
    data, updates = proof.entries(node.inputs[0], depth), proof.entries(node.inputs[2], depth)
    indices = constant_array(node.inputs[1])
    if data is None or updates is None or indices is None or indices.size != len(updates):
        return None
    if attribute_value(node, "reduction", "none") not in ("none", b"none"):
        return None
    entries = list(data)
    for i, update in zip(indices.reshape(-1).tolist(), updates, strict=True):
        if not -len(entries) <= i < len(entries):
            return None
        entries[i] = update
    return entries


def _expand_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    """A 1-D ``Expand`` of entries to ``[n]``: one entry ``n`` times, or the entries as
    they are (``n`` is 1 or their count): what ``repeat_kv`` makes of ``Concat(s, s)``."""
    data, shape = node.inputs[0], proof.entries(node.inputs[1], depth)
    if data is None or data.shape is None or len(data.shape) > 1 or shape is None:
        return None
    entries = proof.entries(data, depth)
    if entries is None or len(shape) != 1 or shape[0] is None or shape[0].value is None:
        return None
    n = shape[0].value
    if len(entries) == 1:
        return entries * n
    return list(entries) if n in (1, len(entries)) else None


READERS: dict[str, Callable[[SizeProof, ir.Node, int], Entries | None]] = {
    "Expand": _expand_read,
    "ScatterElements": _scatter_read,
    "Mul": _arithmetic_read,
    "Div": _arithmetic_read,
    "Sub": _arithmetic_read,
    "Shape": _shape_read,
    "Concat": _concat_read,
    "Gather": _gather_read,
    "Slice": _slice_read,
    "Add": _add_read,
    "Where": _where_read,
}
