"""``SizeProof``: a size of a value on an axis, or the entries of a small integer
tensor, proven from the graph and remembered; the rules per op are ``_rules.py``,
``_windows.py`` and ``_readers.py``."""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array, constant_tensor
from autofusion.fusion_core.sizes._extremes import extreme_read
from autofusion.fusion_core.sizes._readers import READERS, VIEWS, to_int, unknown
from autofusion.fusion_core.sizes._rounding import min_read
from autofusion.fusion_core.sizes._rules import RULES, split
from autofusion.fusion_core.sizes._size import ONE, Size, broadcast, declared, own

__all__ = ["Entries", "SizeProof", "axis_size", "read_sizes"]

_ONNX = ("", "ai.onnx")
_MAX_DEPTH = 48  # a bound on Python's stack, not on what is provable: see SizeProof
Entries = list[Size | None]


def _min_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    """``Min``: a size against its rounded multiple (``_rounding``), else the entries
    one of which is proven at most the other (``_extremes``)."""
    found = min_read(proof, node, depth)
    if found is not None and None not in found:
        return found
    ordered = extreme_read(proof, node, depth)
    return ordered if ordered is not None and None not in ordered else found


# _rounding and _extremes import _readers: joined here
_READERS = {**READERS, "Min": _min_read, "Max": extreme_read}
# Ops whose output 0 has input 0's shape.
SAME_SHAPE = frozenset(
    {
        "Identity", "Cast", "CastLike", "Neg", "Abs", "Relu", "Sigmoid", "Tanh", "Exp", "Log",
        "Sqrt", "Reciprocal", "Erf", "Not", "Floor", "Ceil", "Round", "Sin", "Cos", "Sign",
        "IsNaN", "IsInf", "Softmax", "LogSoftmax", "CumSum", "Trilu", "Dropout", "Clip",
        "LeakyRelu", "Elu", "Selu", "Softplus", "HardSigmoid", "Gelu", "ScatterND",
        "ScatterElements", "LayerNormalization", "RMSNormalization", "BatchNormalization",
        "InstanceNormalization", "GroupNormalization", "HardSwish", "Mish", "PRelu", "Celu",
        "ThresholdedRelu", "Shrink", "Swish", "QuantizeLinear", "DequantizeLinear",
    }
)  # fmt: skip
# Elementwise ops that broadcast their inputs.
BROADCASTS = frozenset(
    {
        "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Where", "Equal", "Less",
        "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "BitShift", "Sum",
    }
)  # fmt: skip


def axis_size(value: ir.Value | None, axis: int) -> Size | None:
    """The size of ``value`` on ``axis``, proven from the graph; None if not proven."""
    return SizeProof().size(value, axis)


def read_sizes(value: ir.Value | None) -> Entries | None:
    """The entries of a small integer tensor as sizes (``SizeProof.entries``)."""
    return SizeProof().entries(value)


class SizeProof:
    """Proves sizes and remembers them. What was cut at the depth bound is not kept (a
    later read, nearer, may prove it), so asking in graph order proves long chains; it
    is kept for the rest of one question only (``_trial``: a graph of residual diamonds
    would be walked again from every side), then proven from the top down (``_warm``)."""

    def __init__(self) -> None:
        self._sizes: dict[tuple[ir.Value, int], Size | None] = {}
        self._entries: dict[ir.Value, Entries | None] = {}
        self._trial: dict[tuple[ir.Value, int] | ir.Value, object] = {}
        self._cuts = 0

    def size(self, value: ir.Value | None, axis: int, depth: int = 0) -> Size | None:
        """The size of ``value`` on ``axis``, proven from the graph (where no rule ties it
        to other sizes, the value's own: ``own``); None where a chain was cut too deep
        or the value has no such axis."""
        cuts = self._cuts
        found = self.bound(value, axis, depth)
        if depth == 0:
            self._trial.clear()
            if found is None and self._cuts > cuts and value is not None:
                self._warm(value)  # a chain past the depth bound: prove it from the top down
                found = self.bound(value, axis)
                self._trial.clear()
        return None if found is None or found.capped else found

    def _warm(self, value: ir.Value) -> None:
        """Ask the sizes of ``value``'s producers' inputs, transitively, in graph order:
        each then recurses only as far as the last one proven."""
        order: list[ir.Value] = []
        seen: set[ir.Value] = set()
        stack: list[tuple[ir.Value, bool]] = [(value, False)]
        while stack:
            current, done = stack.pop()
            if done:
                order.append(current)
                continue
            if current in seen:
                continue
            seen.add(current)
            stack.append((current, True))
            node = current.producer()
            if node is not None:
                stack.extend((v, False) for v in node.inputs if v is not None)
        for current in order:
            for axis in range(len(current.shape or ())):
                self.bound(current, axis)
                self._trial.clear()

    def bound(self, value: ir.Value | None, axis: int, depth: int = 0) -> Size | None:
        """``size``, or a capped size (``Size.capped``), which only a broadcast resolves."""
        if value is None or value.shape is None:
            return None
        rank = len(value.shape)
        axis = axis + rank if axis < 0 else axis
        if not 0 <= axis < rank:
            return None
        key = (value, axis)
        if key in self._sizes:
            return self._sizes[key]
        if depth > _MAX_DEPTH or key in self._trial:
            self._cuts += 1  # what it reads was cut: not to be kept either
            return self._trial.get(key)  # type: ignore[return-value]
        cuts = self._cuts
        found = self._size(value, axis, rank, depth)
        if cuts == self._cuts:
            found = own(value, axis) if found is None else found
            self._sizes[key] = found
        else:
            self._trial[key] = found
        return found

    def _size(self, value: ir.Value, axis: int, rank: int, depth: int) -> Size | None:
        if value.is_graph_input():
            return declared(value.shape[axis], f"{value.name}[{axis}]")  # type: ignore[index]
        tensor = constant_tensor(value)
        if tensor is not None:
            return Size((), int(tensor.shape[axis]))
        node = value.producer()
        if node is None or node.domain not in _ONNX:
            return None
        if node.op_type in SAME_SHAPE and value is node.outputs[0]:
            return self.bound(node.inputs[0], axis, depth + 1)
        if node.op_type in BROADCASTS:
            return broadcast([self.aligned(v, axis, rank, depth) for v in node.inputs])
        if node.op_type == "Split":
            return split(self, node, node.outputs.index(value), axis, depth + 1)
        rule = RULES.get(node.op_type)
        return rule(self, node, axis, rank, depth + 1) if rule is not None else None

    def aligned(self, value: ir.Value | None, axis: int, rank: int, depth: int) -> Size | None:
        """``value``'s size on the axis that broadcasting aligns with ``axis`` of a
        ``rank`` result: 1 where it has no such axis."""
        if value is None or value.shape is None:
            return None
        at = axis - (rank - len(value.shape))
        return ONE if at < 0 else self.bound(value, at, depth + 1)

    def entries(self, value: ir.Value | None, depth: int = 0) -> Entries | None:
        """The entries of a small integer tensor as sizes (None where not proven), or None
        when even its length is unknown: constants, ``Shape`` reads and what views,
        ``Concat``, ``Gather``, ``Slice`` and additions make of them."""
        if value is None:
            return None
        cuts = self._cuts
        found = self._entries_at(value, depth)
        if depth == 0:
            self._trial.clear()
            if self._cuts > cuts:
                self._warm(value)  # a chain past the depth bound: prove it from the top down
                found = self._entries_at(value, 0)
                self._trial.clear()
        return found

    def _entries_at(self, value: ir.Value, depth: int) -> Entries | None:
        if value in self._entries:
            return self._entries[value]
        if depth > _MAX_DEPTH or value in self._trial:
            self._cuts += 1
            return self._trial.get(value)  # type: ignore[return-value]
        cuts = self._cuts
        found = self._read(value, depth)
        if cuts == self._cuts:
            self._entries[value] = found
        else:
            self._trial[value] = found
        return found

    def _read(self, value: ir.Value, depth: int) -> Entries | None:
        array = constant_array(value)
        if array is not None:
            return (
                [Size((), int(a)) for a in array.reshape(-1)] if array.dtype.kind in "iu" else None
            )
        node = value.producer()
        if node is None or node.domain not in _ONNX:
            return unknown(value)
        if node.op_type in VIEWS or (node.op_type == "Cast" and to_int(node)):
            return self.entries(node.inputs[0], depth + 1)
        reader = _READERS.get(node.op_type)
        found = reader(self, node, depth + 1) if reader is not None else None
        return found if found is not None else unknown(value)
