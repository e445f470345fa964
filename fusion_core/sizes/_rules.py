"""Rules of axis sizes, one per op that keeps, moves, joins, cuts or reshapes an axis:
(proof, node, axis, rank, depth) -> the size, or None where not proven."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes._readers import VIEWS
from autofusion.fusion_core.sizes._size import (
    ONE,
    Size,
    arithmetic,
    broadcast,
    is_own,
    multiple,
    scaled,
)
from autofusion.fusion_core.sizes._windows import WINDOW_RULES, axes_of

if TYPE_CHECKING:
    from autofusion.fusion_core.sizes._proof import Entries, SizeProof

__all__ = ["RULES", "split"]

_ONNX = ("", "ai.onnx")
_TO_THE_END = 2**31 - 1  # an end this large is "to the end" (torch writes INT64_MAX)


def _constant_of_shape(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    entries = proof.entries(node.inputs[0], depth)
    return entries[axis] if entries is not None and len(entries) == rank else None


def _transpose(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    perm = attribute_value(node, "perm", None) or list(reversed(range(rank)))
    return proof.bound(node.inputs[0], perm[axis], depth) if len(perm) == rank else None


def _unsqueeze(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    axes = axes_of(node)
    if axes is None:
        return None
    inserted = {a + rank if a < 0 else a for a in axes}
    if axis in inserted:
        return ONE
    return proof.bound(node.inputs[0], axis - sum(1 for a in inserted if a < axis), depth)


def _squeeze(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    axes = axes_of(node)
    if axes is None:
        return None  # every axis of size 1: which ones is a shape's say
    before = rank + len(axes)
    removed = sorted(a + before if a < 0 else a for a in axes)
    kept = [a for a in range(before) if a not in removed]
    return proof.bound(node.inputs[0], kept[axis], depth) if axis < len(kept) else None


def _reshape(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    """An entry of the target read from a size is that size (a target of sizes that do
    not fit fails to run); 0 copies the input's (allowzero 0); -1 is the rest (``_rest``).
    An entry not read, or capped, is the rest too where the others prove it: whatever it
    computes (-1, a 0 that copies, a number), the Reshape runs only where the elements
    count out (torch.export's ``Max(0, -P + Min(128, P + S))``: GPT-Neo's merge of heads)."""
    entries = proof.entries(node.inputs[1], depth) if len(node.inputs) > 1 else None
    if entries is None or len(entries) != rank:
        return None
    entry = entries[axis]
    if entry is None or entry.capped:
        return _rest(proof, node, entries, axis, depth) or entry
    if entry == Size((), 0) and not attribute_value(node, "allowzero", 0):
        return proof.bound(node.inputs[0], axis, depth)
    if entry == Size((), -1):
        return _rest(proof, node, entries, axis, depth)
    # a number entry or a sum with no negative number: never -1 or 0 where it is one
    # (Sub reads ``s - 1``, which is -1 at s = 0)
    return entry if entry.constant > 0 or (entry.atoms and entry.constant >= 0) else None


def _rest(proof: SizeProof, node: ir.Node, entries: Entries, axis: int, depth: int):
    """The -1 entry of a Reshape target: the input's sizes over the other entries, where
    the symbols cancel pairwise and what is left is a number or one size times 1."""
    source = node.inputs[0]
    if source is None or source.shape is None:
        return None
    tops = [proof.size(source, a, depth) for a in range(len(source.shape))]
    copies = not attribute_value(node, "allowzero", 0)  # a 0 entry copies the input's
    zero = Size((), 0)
    bottoms = [
        (tops[i] if copies and e == zero and i < len(tops) else e)
        for i, e in enumerate(entries)
        if i != axis
    ]
    if any(s is None for s in tops + bottoms) or not _cancel(tops, bottoms):  # type: ignore[arg-type]
        return None
    number, divisor = 1, 1
    for s in bottoms:
        divisor *= s.constant  # type: ignore[union-attr]
    left = [s for s in tops if s.value is None]  # type: ignore[union-attr]
    for s in tops:
        number *= s.constant if s.value is not None else 1  # type: ignore[union-attr]
    if divisor <= 0 or len(left) > 1:
        return None
    if not left:
        return None if number % divisor else Size((), number // divisor)
    return scaled(left[0], number, divisor)  # type: ignore[arg-type]


def _cancel(tops: list[Size], bottoms: list[Size]) -> bool:
    """Cancel each symbolic size of ``bottoms`` against one of ``tops`` (in place): the
    same size, or a whole multiple of one, the factor left as a number on the other
    side (TorchScript's fold of heads into the batch, ``[B, N, S, H]`` to ``[N * B, -1,
    H]``, reads ``N * B`` over ``B``: the rest is ``S``). Exact: ``k * t`` over ``t`` is
    ``k``, as polynomials. False where one does not cancel."""
    for size in [s for s in bottoms if s.value is None]:
        found = next(((t, 1, 1) for t in tops if t == size), None)
        found = found or next(((t, k, 1) for t in tops if (k := multiple(size, t))), None)
        found = found or next(((t, 1, k) for t in tops if (k := multiple(t, size))), None)
        if found is None:
            return False
        top, over, times = found
        tops.remove(top)
        bottoms.remove(size)
        tops.append(Size((), times))
        bottoms.append(Size((), over))
    return True


def _expand(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    target = proof.entries(node.inputs[1], depth)
    if target is None:
        return None
    at = axis - (rank - len(target))
    mine = proof.aligned(node.inputs[0], axis, rank, depth)
    return broadcast([mine, ONE if at < 0 else target[at]])


def _range(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    """``Range(a, b, 1)`` is ``b - a`` long, for sizes (never negative)."""
    delta = constant_array(node.inputs[2])
    if delta is None or delta.size != 1 or float(delta.reshape(-1)[0]) != 1:
        return None
    start, limit = (_single(proof.entries(v, depth)) for v in node.inputs[:2])
    length = arithmetic("Sub", limit, start)
    if length is None or (length.value is None and length.constant < 0):
        return None
    return Size((), max(length.value, 0)) if length.value is not None else length


def _concat(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    """Off the joined axis the inputs must have one size (else it fails to run): any
    input's proven one; on it, their sum."""
    joined = attribute_value(node, "axis", 0)
    joined = joined + rank if joined < 0 else joined
    if axis != joined:
        sizes = [proof.bound(v, axis, depth) for v in node.inputs]
        exact = [s for s in sizes if s is not None and not s.capped]
        exact.sort(key=is_own)  # an input's own size only where none is tied to others
        return exact[0] if exact else next((s for s in sizes if s is not None), None)
    sizes = [proof.size(v, axis, depth) for v in node.inputs]
    if any(s is None for s in sizes):
        return None
    total = Size()
    for s in sizes:
        total = total + s  # type: ignore[operator]
    return total


def _slice(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    """An axis the Slice does not name keeps its size. On the one it names: numbers
    throughout give a number; from 0 with step 1 to a size ``e`` it is ``min(e, n)``
    long: ``e`` where ``n`` is ``e``, else capped (``n`` a number)."""
    axes = constant_array(node.inputs[3]) if len(node.inputs) > 3 else None
    if axes is None:
        return None
    named = [int(a) + rank if a < 0 else int(a) for a in axes.reshape(-1)]
    if axis not in named:
        return proof.bound(node.inputs[0], axis, depth)
    if len(named) != 1:
        return None
    start, end = (_single(proof.entries(v, depth)) for v in node.inputs[1:3])
    step = _single(proof.entries(node.inputs[4], depth)) if len(node.inputs) > 4 else ONE
    whole = proof.size(node.inputs[0], axis, depth)
    if start is None and step == ONE and end is not None and end.value is not None:
        back = _single(_negated(proof, node.inputs[1], depth))  # x[-e:]: min(e, n) long
        if back is not None and whole is not None and end.value >= _TO_THE_END:
            return whole if back == whole else None
    if None in (start, end, step, whole) or start.value is None or step.value is None:
        return None
    if whole.value is not None and end.value is not None and step.value:
        return Size((), len(range(whole.value)[start.value : end.value : step.value]))
    if start.value or step.value != 1 or end.constant < 0:
        return None
    if end.value is not None and end.value >= _TO_THE_END:
        return whole
    if whole.atoms == end.atoms:  # n + a cut at n + b: min(a, b) over n, capped if b is
        return Size(end.atoms, min(whole.constant, end.constant), capped=end.capped)
    if whole.value is None or whole.value < 2:  # min(e, 1) is 1 wherever e is not 0
        return None
    return Size(end.atoms, end.constant, capped=True)  # a cap of 2 or more: 1 only where e is


def _negated(proof: SizeProof, value: ir.Value | None, depth: int) -> Entries | None:
    """The entries ``e`` of ``value = -e`` (through views and casts)."""
    node = value.producer() if value is not None else None
    while node is not None and (node.op_type in VIEWS or node.op_type == "Cast"):
        node = node.inputs[0].producer() if node.inputs[0] is not None else None
    if node is None or node.op_type != "Neg" or node.domain not in _ONNX:
        return None
    return proof.entries(node.inputs[0], depth)


def _single(entries: Entries | None) -> Size | None:
    return entries[0] if entries is not None and len(entries) == 1 else None


def _gather(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    data, indices = node.inputs[0], node.inputs[1]
    if data is None or indices is None or data.shape is None or indices.shape is None:
        return None
    picked = attribute_value(node, "axis", 0)
    picked = picked + len(data.shape) if picked < 0 else picked
    if axis < picked:
        return proof.bound(data, axis, depth)
    if axis < picked + len(indices.shape):
        return proof.bound(indices, axis - picked, depth)
    return proof.bound(data, axis - len(indices.shape) + 1, depth)


def _matmul(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    a, b = node.inputs[0], node.inputs[1]
    if a is None or b is None or a.shape is None or b.shape is None:
        return None
    if len(a.shape) < 2 or len(b.shape) < 2:
        return None
    if axis == rank - 1:
        return proof.bound(b, -1, depth)
    if axis == rank - 2:
        return proof.bound(a, -2, depth)
    return broadcast([proof.aligned(v, axis, rank, depth) for v in (a, b)])


def split(proof: SizeProof, node: ir.Node, index: int, axis: int, depth: int):
    """Off the cut axis a part keeps the input's size; on it, the ``split`` entry (the
    input from opset 13, the attribute before) or an equal share of a number."""
    rank = len(node.outputs[index].shape or ())
    cut = attribute_value(node, "axis", 0)
    cut = cut + rank if cut < 0 else cut
    if axis != cut:
        return proof.bound(node.inputs[0], axis, depth)
    given = node.inputs[1] if len(node.inputs) > 1 else None
    sizes = proof.entries(given, depth) if given is not None else None
    if sizes is None and attribute_value(node, "split", None) is not None:
        sizes = [Size((), int(n)) for n in attribute_value(node, "split", None)]
    if sizes is not None:
        return sizes[index] if len(sizes) == len(node.outputs) else None
    whole, parts = proof.size(node.inputs[0], cut, depth), len(node.outputs)
    if whole is None or whole.value is None or given is not None:
        return None
    share = -(-whole.value // parts)  # onnx: equal parts, the last one smaller
    return Size((), max(0, min(share, whole.value - share * index)))


def _gather_nd(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    """``indices.shape[:-1] + data.shape[batch_dims + k:]``, ``k`` the number of indices'
    last axis."""
    data, indices = node.inputs[0], node.inputs[1]
    if data is None or indices is None or indices.shape is None:
        return None
    k = proof.size(indices, -1, depth)
    if k is None or k.value is None:
        return None
    outer = len(indices.shape) - 1
    if axis < outer:
        return proof.bound(indices, axis, depth)
    return proof.bound(data, axis - outer + attribute_value(node, "batch_dims", 0) + k.value, depth)


RULES: dict[str, Callable[[SizeProof, ir.Node, int, int, int], Size | None]] = {
    **WINDOW_RULES,
    "ConstantOfShape": _constant_of_shape,
    "Transpose": _transpose,
    "Unsqueeze": _unsqueeze,
    "Squeeze": _squeeze,
    "Reshape": _reshape,
    "Expand": _expand,
    "Range": _range,
    "Concat": _concat,
    "Slice": _slice,
    "Gather": _gather,
    "MatMul": _matmul,
    "GatherND": _gather_nd,
}
