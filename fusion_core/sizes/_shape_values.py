"""Small integer tensors the graph computes from shapes, read entry by entry.

Exporters compute slice bounds and reshape targets from ``Shape`` reads: the TorchScript
exporter writes the rotary half as ``Div(Gather(Shape(q), 3), 2)``, which constant
folding leaves alone once ``Shape(q)`` has become a ``Concat`` of the batch, a constant
and the sequence. ``entries`` follows such a computation through views, ``Concat``,
``Gather``, ``Shape`` and integer arithmetic and gives each entry as a number where the
graph fixes it, ``None`` where it depends on an input. Symbolic dimensions stay ``None``:
callers that need to compare them read the values' shapes instead (``known_dims``).

Every stage that reads shapes uses these (the pre-passes, canonical's rules, the
rewriters), so they live here, beside the proof, not in one stage another must reach
into. ``axes_of`` is the proof's own (``_windows.py``): one reading of an op's axes.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array, constant_picks
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes._windows import axes_of

__all__ = [
    "Dim",
    "axes_of",
    "dim_entries",
    "entries",
    "grid_component",
    "grid_parts",
    "known_dims",
    "scalar",
]

Dim = int | str | None  # a known size, a symbolic one, or unknown

_MAX_DEPTH = 12
_VIEWS = frozenset({"Unsqueeze", "Squeeze", "Reshape", "Identity", "Flatten"})
_ARITHMETIC = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": lambda a, b: np.trunc(a / b).astype(np.int64),  # integer Div truncates
}


def known_dims(value: ir.Value | None) -> list[Dim] | None:
    """The value's dimensions: numbers, symbol names, or None where unknown."""
    if value is None or value.shape is None:
        return None
    return [d if isinstance(d, int) else (d.value if d.value else None) for d in value.shape]


def entries(value: ir.Value | None, depth: int = 0) -> list[int | None] | None:
    """The flattened entries of an integer tensor (None where not fixed by the graph),
    or None when even its length is unknown."""
    return _entries(value, depth, symbolic=False)  # type: ignore[return-value]


def dim_entries(value: ir.Value | None) -> list[Dim] | None:
    """As ``entries``, but an entry read from a symbolic dimension of a shape is that
    symbol's name (``"batch"``): what a reshape target copies from a shape."""
    return _entries(value, 0, symbolic=True)


def _entries(value: ir.Value | None, depth: int, symbolic: bool) -> list[Dim] | None:
    if value is None or depth > _MAX_DEPTH:
        return None
    array = constant_array(value)
    if array is not None:
        if array.dtype.kind not in "iu":
            return None
        return [int(a) for a in array.reshape(-1)]
    producer = value.producer()
    if producer is None:
        return _unknown(value)
    op = producer.op_type
    if op in _VIEWS or (op == "Cast" and _is_int_cast(producer)):
        return _entries(producer.inputs[0], depth + 1, symbolic)
    if op == "Shape":
        return _shape_entries(producer, symbolic)
    if op == "Concat":
        parts = [_entries(v, depth + 1, symbolic) for v in producer.inputs]
        if any(p is None for p in parts):
            return _unknown(value)
        return [e for p in parts for e in p]  # type: ignore[union-attr]
    if op == "Gather" and attribute_value(producer, "axis", 0) == 0:
        return _gathered(producer, depth, symbolic) or _unknown(value)
    if op == "Slice" and len(producer.inputs) >= 3:
        return _sliced(producer, depth, symbolic) or _unknown(value)
    if op in _ARITHMETIC:
        return _arithmetic(producer, depth) or _unknown(value)
    return _unknown(value)


def scalar(value: ir.Value | None) -> int | None:
    """The value as one integer, when the graph fixes it."""
    found = entries(value)
    if found is None or len(found) != 1:
        return None
    return found[0]


def _unknown(value: ir.Value) -> list[int | None] | None:
    """Unknown entries, as many as the value's static shape says (or None)."""
    if value.shape is None or not value.shape.is_static():
        return None
    return [None] * int(np.prod(value.shape.numpy(), dtype=np.int64))


def _is_int_cast(node: ir.Node) -> bool:
    to = attribute_value(node, "to", 0)
    return to in (ir.DataType.INT64, ir.DataType.INT32)


def _shape_entries(node: ir.Node, symbolic: bool) -> list[Dim] | None:
    dims = known_dims(node.inputs[0])
    if dims is None:
        return None
    start = attribute_value(node, "start", 0) or 0
    end = attribute_value(node, "end", None)
    picked = dims[start:end] if end is not None else dims[start:]
    return [d if isinstance(d, int) or symbolic else None for d in picked]


def _gathered(node: ir.Node, depth: int, symbolic: bool) -> list[Dim] | None:
    data = _entries(node.inputs[0], depth + 1, symbolic)
    return constant_picks(data, node.inputs[1]) if data is not None else None


def _sliced(node: ir.Node, depth: int, symbolic: bool) -> list[Dim] | None:
    """A 1-D Slice with constant bounds (axis 0, any step) of entries."""
    data = _entries(node.inputs[0], depth + 1, symbolic)
    bounds = [constant_array(v) if v is not None else None for v in node.inputs[1:5]]
    starts, ends = bounds[0], bounds[1]
    axes = bounds[2] if len(bounds) > 2 and bounds[2] is not None else np.zeros(1, np.int64)
    steps = bounds[3] if len(bounds) > 3 and bounds[3] is not None else np.ones(1, np.int64)
    if (
        data is None
        or starts is None
        or ends is None
        or axes.reshape(-1).tolist() not in ([0], [-1])
    ):
        return None
    if starts.size != 1 or ends.size != 1 or steps.size != 1 or int(steps.reshape(-1)[0]) == 0:
        return None
    picked = range(len(data))[slice(*(int(b.reshape(-1)[0]) for b in (starts, ends, steps)))]
    return [data[i] for i in picked]


def _arithmetic(node: ir.Node, depth: int) -> list[int | None] | None:
    a, b = (entries(v, depth + 1) for v in node.inputs[:2])
    if a is None or b is None or None in a or None in b:
        return None
    x, y = np.array(a, np.int64), np.array(b, np.int64)
    if x.size != y.size and 1 not in (x.size, y.size):
        return None
    if node.op_type == "Div" and np.any(y == 0):
        return None
    return [int(v) for v in np.atleast_1d(_ARITHMETIC[node.op_type](x, y))]


def grid_parts(indices: ir.Value | None, dims: list[Dim]) -> list[ir.Value | None] | None:
    """The components of an index grid of a ``dims`` tensor: ``indices`` a Concat of
    ``len(dims)`` parts on a new last axis (each part ``grid_component``'s), else None."""
    concat = indices.producer() if indices is not None else None
    rank = len(dims)
    if concat is None or concat.op_type != "Concat" or len(concat.inputs) != rank:
        return None
    return list(concat.inputs) if attribute_value(concat, "axis", 0) % (rank + 1) == rank else None


def grid_component(part: ir.Value | None, axis: int, dims: list[Dim]) -> ir.Value | None:
    """``v`` where ``part`` is one component of an index grid, ``Unsqueeze(Expand(v),
    -1)`` of shape ``[*dims, 1]``, ``v`` varying along ``axis`` only (every other
    dimension 1, right-aligned, as torch's advanced indexing writes it); else None."""
    unsqueeze = part.producer() if part is not None else None
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or known_dims(part) != [*dims, 1]:
        return None
    expand = unsqueeze.inputs[0].producer() if unsqueeze.inputs[0] is not None else None
    if expand is None or expand.op_type != "Expand" or known_dims(expand.outputs[0]) != dims:
        return None
    before = known_dims(expand.inputs[0])
    if before is None or len(before) > len(dims):
        return None
    padded = [1] * (len(dims) - len(before)) + before
    if any(d != 1 for k, d in enumerate(padded) if k != axis) or padded[axis] != dims[axis]:
        return None
    return expand.inputs[0]
