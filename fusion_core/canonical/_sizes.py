"""Sizes proven from the graph's structure, never from an inferred shape.

A rule that removes an op because two sizes are equal needs them equal at every input
size, not at the ones a shape inference guessed. onnxruntime's symbolic inference
"auto-merges" symbols it cannot compare: it labelled Kimi-Linear's padded length (the
sequence rounded up to a chunk) ``sequence``, the very symbol of the unpadded length.
So ``axis_size`` follows a value back to where its size is fixed: a graph input's
declared dimension, a constant's shape, an entry of a Reshape or Expand target read
from another size, the length of ``Range(0, n, 1)``; through the ops that keep or move
an axis (elementwise ops, whose other inputs are 1 or the same size there, Transpose,
Unsqueeze, Squeeze, Concat, Gather, MatMul). What it cannot follow is None, not a guess.

A size is a sum of atoms and a constant (``Size``): an atom is a declared symbol of a
graph input (``batch``), or an unnamed input dimension. A declared expression
``past_sequence_length + sequence_length`` is that sum, so it equals the length of a
Range to ``past + sequence`` read from the cache's and the ids' shapes. Symbols the
model declares on its inputs are its interface (the check generates inputs that keep
them), unlike those an inference assigned to inner values.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from autofusion.fusion_core.canonical._shape_values import axes_of
from autofusion.fusion_core.ir import constant_array, constant_tensor
from autofusion.fusion_core.patterns import attribute_value

__all__ = ["Size", "axis_size", "read_sizes"]

_ONNX = ("", "ai.onnx")
_MAX_DEPTH = 48
# Ops whose output 0 has input 0's shape.
_SAME_SHAPE = frozenset(
    {
        "Identity", "Cast", "CastLike", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Exp", "Log",
        "Sqrt", "Reciprocal", "Erf", "Not", "Floor", "Ceil", "Round", "Sin", "Cos", "Sign",
        "IsNaN", "IsInf", "Softmax", "LogSoftmax", "CumSum", "Trilu", "Dropout", "Clip",
        "LeakyRelu", "Elu", "Selu", "Softplus", "HardSigmoid", "Gelu", "ScatterND",
        "ScatterElements", "LayerNormalization", "RMSNormalization",
    }
)  # fmt: skip
# Elementwise ops that broadcast their inputs.
_BROADCAST = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Where", "Equal", "Less",
        "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "Sum",
    }
)  # fmt: skip
_VIEWS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten"})
_TERM = re.compile(r"^\s*([A-Za-z_][A-Za-z_0-9.]*|\d+)\s*$")


@dataclass(frozen=True)
class Size:
    """A size: the sum of ``atoms`` (sorted; symbols) and ``constant``."""

    atoms: tuple[str, ...] = ()
    constant: int = 0

    def __add__(self, other: Size) -> Size:
        return Size(tuple(sorted(self.atoms + other.atoms)), self.constant + other.constant)

    @property
    def value(self) -> int | None:
        """The size as a number, where it is one."""
        return None if self.atoms else self.constant


ONE = Size((), 1)


def declared(dim: int | ir.SymbolicDim, where: str) -> Size | None:
    """A graph input's declared dimension: a number, a symbol, a sum of symbols and
    numbers (``past_sequence_length + sequence_length``); ``where`` names an unnamed one."""
    if isinstance(dim, int):
        return Size((), dim)
    text = dim.value
    if not text:
        return Size((f"#{where}",), 0)
    size = Size()
    for term in text.split("+"):
        match = _TERM.match(term)
        if match is None:
            return Size((text.strip(),), 0)  # another expression: one atom, compared as text
        word = match.group(1)
        size = size + (Size((), int(word)) if word.isdigit() else Size((word,), 0))
    return size


def axis_size(value: ir.Value | None, axis: int, depth: int = 0) -> Size | None:
    """The size of ``value`` on ``axis``, proven from the graph; None if not proven."""
    if value is None or depth > _MAX_DEPTH or value.shape is None:
        return None
    rank = len(value.shape)
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis < rank:
        return None
    if value.is_graph_input():
        return declared(value.shape[axis], f"{value.name}[{axis}]")
    tensor = constant_tensor(value)
    if tensor is not None:
        return Size((), int(tensor.shape[axis]))
    node = value.producer()
    if node is None or node.domain not in _ONNX:
        return None
    if node.op_type in _SAME_SHAPE and value is node.outputs[0]:
        return axis_size(node.inputs[0], axis, depth + 1)
    if node.op_type in _BROADCAST:
        return _broadcast([_aligned(v, axis, rank, depth) for v in node.inputs])
    rule = _RULES.get(node.op_type)
    return rule(node, value, axis, rank, depth + 1) if rule is not None else None


def _aligned(value: ir.Value | None, axis: int, rank: int, depth: int) -> Size | None:
    """``value``'s size on the axis that broadcasting aligns with ``axis`` of a ``rank``
    result: 1 where it has no such axis."""
    if value is None or value.shape is None:
        return None
    at = axis - (rank - len(value.shape))
    return ONE if at < 0 else axis_size(value, at, depth + 1)


def _broadcast(sizes: list[Size | None]) -> Size | None:
    """The broadcast of sizes: the one size other than 1, where all others are 1."""
    if any(s is None for s in sizes):
        return None
    others = {s for s in sizes if s != ONE}
    if not others:
        return ONE
    return others.pop() if len(others) == 1 else None


def read_sizes(value: ir.Value | None, depth: int = 0) -> list[Size | None] | None:
    """The entries of a small integer tensor as sizes (None where not proven), or None
    when even its length is unknown: constants, ``Shape`` reads and what views,
    ``Concat``, ``Gather``, ``Slice`` and additions make of them."""
    if value is None or depth > _MAX_DEPTH:
        return None
    array = constant_array(value)
    if array is not None:
        return [Size((), int(a)) for a in array.reshape(-1)] if array.dtype.kind in "iu" else None
    node = value.producer()
    if node is None or node.domain not in _ONNX:
        return _unknown(value)
    if node.op_type in _VIEWS or (node.op_type == "Cast" and _to_int(node)):
        return read_sizes(node.inputs[0], depth + 1)
    reader = _READERS.get(node.op_type)
    found = reader(node, depth + 1) if reader is not None else None
    return found if found is not None else _unknown(value)


def _to_int(node: ir.Node) -> bool:
    return attribute_value(node, "to", 0) in (ir.DataType.INT64, ir.DataType.INT32)


def _unknown(value: ir.Value) -> list[Size | None] | None:
    if value.shape is None or not value.shape.is_static():
        return None
    count = 1
    for d in value.shape:
        count *= int(d)
    return [None] * count


def _shape_read(node: ir.Node, depth: int) -> list[Size | None] | None:
    source = node.inputs[0]
    if source is None or source.shape is None:
        return None
    rank = len(source.shape)
    start = attribute_value(node, "start", 0) or 0
    end = attribute_value(node, "end", None)
    axes = range(rank)[start:end] if end is not None else range(rank)[start:]
    return [axis_size(source, a, depth) for a in axes]


def _concat_read(node: ir.Node, depth: int) -> list[Size | None] | None:
    parts = [read_sizes(v, depth) for v in node.inputs]
    if any(p is None for p in parts):
        return None
    return [e for p in parts for e in p]  # type: ignore[union-attr]


def _gather_read(node: ir.Node, depth: int) -> list[Size | None] | None:
    data, index = read_sizes(node.inputs[0], depth), constant_array(node.inputs[1])
    if data is None or index is None or attribute_value(node, "axis", 0) != 0:
        return None
    picked = []
    for i in index.reshape(-1):
        i = int(i) + (len(data) if i < 0 else 0)
        if not 0 <= i < len(data):
            return None
        picked.append(data[i])
    return picked


def _slice_read(node: ir.Node, depth: int) -> list[Size | None] | None:
    """A 1-D Slice with constant bounds (axis 0, any step) of entries."""
    data = read_sizes(node.inputs[0], depth)
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


def _add_read(node: ir.Node, depth: int) -> list[Size | None] | None:
    a, b = (read_sizes(v, depth) for v in node.inputs[:2])
    if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
        return None
    n = max(len(a), len(b))
    pairs = [(a[i % len(a)], b[i % len(b)]) for i in range(n)]
    return [x + y if x is not None and y is not None else None for x, y in pairs]


def _where_read(node: ir.Node, depth: int) -> list[Size | None] | None:
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
    chosen, other = read_sizes(node.inputs[2], depth), read_sizes(node.inputs[1], depth)
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


def _constant_of_shape(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    entries = read_sizes(node.inputs[0], depth)
    return entries[axis] if entries is not None and len(entries) == rank else None


def _transpose(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    perm = attribute_value(node, "perm", None) or list(reversed(range(rank)))
    return axis_size(node.inputs[0], perm[axis], depth) if len(perm) == rank else None


def _unsqueeze(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    axes = axes_of(node)
    if axes is None:
        return None
    inserted = {a + rank if a < 0 else a for a in axes}
    if axis in inserted:
        return ONE
    return axis_size(node.inputs[0], axis - sum(1 for a in inserted if a < axis), depth)


def _squeeze(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    axes = axes_of(node)
    if axes is None:
        return None  # every axis of size 1: which ones is a shape's say
    before = rank + len(axes)
    removed = sorted(a + before if a < 0 else a for a in axes)
    kept = [a for a in range(before) if a not in removed]
    return axis_size(node.inputs[0], kept[axis], depth) if axis < len(kept) else None


def _reshape(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    """An entry of the target read from a size is that size (a target of sizes that do
    not fit fails to run); 0 copies the input's (allowzero 0); -1 is not followed."""
    entries = read_sizes(node.inputs[1], depth) if len(node.inputs) > 1 else None
    if entries is None or len(entries) != rank or entries[axis] is None:
        return None
    entry = entries[axis]
    if entry == Size((), 0) and not attribute_value(node, "allowzero", 0):
        return axis_size(node.inputs[0], axis, depth)
    return entry if entry.value is None or entry.value > 0 else None


def _expand(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    target = read_sizes(node.inputs[1], depth)
    if target is None:
        return None
    at = axis - (rank - len(target))
    return _broadcast([_aligned(node.inputs[0], axis, rank, depth), ONE if at < 0 else target[at]])


def _range(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    """``Range(0, n, 1)`` is n long, for a size n (never negative)."""
    start, delta = (constant_array(v) for v in (node.inputs[0], node.inputs[2]))
    if start is None or delta is None or start.size != 1 or delta.size != 1:
        return None
    if float(start.reshape(-1)[0]) != 0 or float(delta.reshape(-1)[0]) != 1:
        return None
    limit = read_sizes(node.inputs[1], depth)
    size = limit[0] if limit is not None and len(limit) == 1 else None
    return size if size is not None and size.constant >= 0 else None


def _concat(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    """Off the joined axis the inputs must have one size (else it fails to run): any
    input's proven one; on it, their sum."""
    joined = attribute_value(node, "axis", 0)
    joined = joined + rank if joined < 0 else joined
    sizes = [axis_size(v, axis, depth) for v in node.inputs]
    if axis != joined:
        return next((s for s in sizes if s is not None), None)
    if any(s is None for s in sizes):
        return None
    total = Size()
    for s in sizes:
        total = total + s  # type: ignore[operator]
    return total


def _slice(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    """An axis the Slice does not name keeps its size."""
    axes = constant_array(node.inputs[3]) if len(node.inputs) > 3 else None
    if axes is None:
        return None
    named = {int(a) + rank if a < 0 else int(a) for a in axes.reshape(-1)}
    return None if axis in named else axis_size(node.inputs[0], axis, depth)


def _gather(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    data, indices = node.inputs[0], node.inputs[1]
    if data is None or indices is None or data.shape is None or indices.shape is None:
        return None
    picked = attribute_value(node, "axis", 0)
    picked = picked + len(data.shape) if picked < 0 else picked
    if axis < picked:
        return axis_size(data, axis, depth)
    if axis < picked + len(indices.shape):
        return axis_size(indices, axis - picked, depth)
    return axis_size(data, axis - len(indices.shape) + 1, depth)


def _matmul(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    a, b = node.inputs[0], node.inputs[1]
    if a is None or b is None or a.shape is None or b.shape is None:
        return None
    if len(a.shape) < 2 or len(b.shape) < 2:
        return None
    if axis == rank - 1:
        return axis_size(b, -1, depth)
    if axis == rank - 2:
        return axis_size(a, -2, depth)
    return _broadcast([_aligned(v, axis, rank, depth) for v in (a, b)])


def _split(node: ir.Node, value: ir.Value, axis: int, rank: int, depth: int):
    cut = attribute_value(node, "axis", 0)
    cut = cut + rank if cut < 0 else cut
    return None if axis == cut else axis_size(node.inputs[0], axis, depth)


_Rule = Callable[[ir.Node, ir.Value, int, int, int], Size | None]
_RULES: dict[str, _Rule] = {
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
    "Split": _split,
}
_READERS: dict[str, Callable[[ir.Node, int], list[Size | None] | None]] = {
    "Shape": _shape_read,
    "Concat": _concat_read,
    "Gather": _gather_read,
    "Slice": _slice_read,
    "Add": _add_read,
    "Where": _where_read,
}
