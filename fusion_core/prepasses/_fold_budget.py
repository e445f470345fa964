"""The fold budget: what constant folding may materialize beyond the model it was given.

A 6 KB model of 100 ``ConstantOfShape`` (1024x2048) summed made the folder write 800 MiB
of constants, every one under the per-tensor limit (``fold_output_size_limit``). The
budget bounds the total: ``fold_growth_ratio`` x the bytes of constants the model holds,
plus ``fold_growth_floor_bytes``, so a model whose weights are real may grow as much as
folding ever grows one (a Cast of fp16 weights to fp32 doubles them) while a model made
of fills gets the floor.

It is charged as the fold goes, from onnxscript's ``should_fold`` hook, which runs
before a value is computed: the value's size is predicted from its shape
(ConstantOfShape, Expand, Tile and Range from their constant inputs, any other op from
the shape onnxscript inferred for it), and a value that would take the growth past the
budget stays as its producer, never computed. Refusing after computing would already
have cost the memory. A value over the per-tensor limit, which onnxscript would compute
and then throw away, is refused the same way, before it is computed.

Growth is net: the constants only the folded node reads go with it (a Transpose of a
weight read once costs nothing). What a fold adds is measured once the value exists, so
a shape the model declares falsely cannot make a large value pass as a small one; such a
value, or one whose size cannot be predicted, can take the growth past the budget by
itself alone (the per-tensor limit bounds it), and nothing grows after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir
from onnxscript.optimizer._constant_folding import DEFAULT_CONSTANT_FOLD_BLACKLIST

__all__ = ["FoldBudget", "FoldRecord", "Unfolded", "constant_bytes"]

# The report lists this many of the values left unfolded; the count and bytes cover all.
LISTED = 10
# Reasons a value is left unfolded.
OVER_BUDGET = "fold_budget"
OVER_TENSOR_LIMIT = "tensor_limit"
_STANDARD = ("", "ai.onnx")
_SMALL = 64  # elements: the shape-like inputs read to predict a size


@dataclass(frozen=True)
class Unfolded:
    """A value left as its producer: ``bytes`` it would have held (None: unknown)."""

    name: str
    op_type: str
    bytes: int | None
    reason: str  # OVER_BUDGET or OVER_TENSOR_LIMIT

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "op_type": self.op_type,
            "bytes": self.bytes,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class FoldRecord:
    """What one fold was allowed and what it left: the report's ``folding``."""

    budget_bytes: int
    grown_bytes: int  # net bytes of constants the fold added (negative: it shrank them)
    unfolded: tuple[Unfolded, ...] = ()

    def to_dict(self) -> dict:
        reasons = [u.reason for u in self.unfolded]
        return {
            "budget_bytes": self.budget_bytes,
            "grown_bytes": self.grown_bytes,
            "unfolded_count": len(self.unfolded),
            "unfolded_bytes": sum(u.bytes or 0 for u in self.unfolded),
            "reasons": {r: reasons.count(r) for r in (OVER_BUDGET, OVER_TENSOR_LIMIT)},
            "unfolded": [u.to_dict() for u in self.unfolded[:LISTED]],
        }


@dataclass
class _Pending:
    """The node last allowed, charged once the fold has (or has not) replaced it."""

    node: ir.Node
    graph: ir.Graph | None
    name: str | None
    predicted: int | None
    freed: int


class FoldBudget:
    """A ``should_fold`` for onnxscript's folder that keeps the growth within a budget.

    ``decide`` is the rule it wraps (True: fold, False: keep, None: onnxscript's
    defaults); the limits are onnxscript's, in elements. ``begin`` sets the budget from
    the model; ``record`` settles the last node allowed and says what happened."""

    def __init__(
        self,
        *,
        ratio: float,
        floor: int,
        input_size_limit: int,
        output_size_limit: int,
        decide: Callable[[ir.Node], bool | None] = lambda _node: None,
    ) -> None:
        self.ratio, self.floor, self.decide = ratio, floor, decide
        self.input_size_limit, self.output_size_limit = input_size_limit, output_size_limit
        self.limit = self.grown = 0
        self.unfolded: list[Unfolded] = []
        self._pending: _Pending | None = None

    def begin(self, model: ir.Model) -> None:
        self.limit = int(self.ratio * constant_bytes(model)) + self.floor
        self.grown, self.unfolded, self._pending = 0, [], None

    def record(self) -> FoldRecord:
        self.settle()
        return FoldRecord(self.limit, self.grown, tuple(self.unfolded))

    def __call__(self, node: ir.Node) -> bool | None:
        self.settle()
        decision = self.decide(node)
        if decision is False or len(node.outputs) != 1:
            return decision  # kept, or several outputs (which onnxscript never folds)
        if decision is None and _kept_by_onnxscript(node, self.input_size_limit):
            return None  # its own rules keep it: not the budget's doing
        predicted = _predicted(node)
        freed = _freed_bytes(node)
        if predicted is not None:
            elements, size = predicted
            if elements > self.output_size_limit and elements > _single_use_elements(node):
                return self._refuse(node, size, OVER_TENSOR_LIMIT)
            growth = size - freed
            if growth > 0 and self.grown + growth > self.limit:
                return self._refuse(node, size, OVER_BUDGET)
        elif self.grown >= self.limit:
            return self._refuse(node, None, OVER_BUDGET)
        size = predicted[1] if predicted is not None else None
        self._pending = _Pending(node, node.graph, node.outputs[0].name, size, freed)
        return decision

    def settle(self) -> None:
        """Charge the node last allowed, if the fold replaced it."""
        pending, self._pending = self._pending, None
        if pending is None or pending.node.graph is not None:
            return  # nothing pending, or onnxscript kept the node after all
        made = pending.predicted
        if pending.graph is not None and pending.name in pending.graph.initializers:
            made = pending.graph.initializers[pending.name].const_value.nbytes
        self.grown += (made or 0) - pending.freed

    def _refuse(self, node: ir.Node, size: int | None, reason: str) -> bool:
        self.unfolded.append(Unfolded(node.name or "", node.op_type, size, reason))
        return False


def constant_bytes(model: ir.Model) -> int:
    """Bytes of every constant the model holds: initializers of every graph and tensor
    attributes anywhere (Constant nodes, function bodies). Lazy external tensors are
    counted from their shape, not read."""
    total = sum(
        v.const_value.nbytes
        for graph in model.graphs()
        for v in graph.initializers.values()
        if v.const_value is not None
    )
    for owner in [model.graph, *model.functions.values()]:
        for node in ir.traversal.RecursiveGraphIterator(owner):
            for attr in node.attributes.values():
                if attr.is_ref() or attr.value is None:
                    continue
                if attr.type == ir.AttributeType.TENSOR:
                    total += attr.value.nbytes
                elif attr.type == ir.AttributeType.TENSORS:
                    total += sum(t.nbytes for t in attr.value)
    return total


def _kept_by_onnxscript(node: ir.Node, input_size_limit: int) -> bool:
    """Whether onnxscript's default rules (``should_fold`` None) keep ``node``: an op of
    its block list, or an input over the input limit (but a Transpose that alone reads
    it). Mirrors onnxscript 0.7's ``FoldConstantsPass.process_node``."""
    if node.domain in _STANDARD and node.op_type in DEFAULT_CONSTANT_FOLD_BLACKLIST:
        return True
    large = [
        v is not None and v.const_value is not None and v.const_value.size > input_size_limit
        for v in node.inputs
    ]
    if not any(large):
        return False
    if node.domain in _STANDARD and node.op_type == "Transpose":
        return not all(
            len(v.consumers()) == 1 or not big
            for v, big in zip(node.inputs, large, strict=True)
            if v is not None
        )
    return True


def _predicted(node: ir.Node) -> tuple[int, int] | None:
    """(elements, bytes) of the node's one output, or None when they cannot be told."""
    dims, dtype = _output_dims(node), _output_dtype(node)
    if dims is None or dtype is None or any(d < 0 for d in dims):
        return None
    elements = math.prod(dims)
    try:
        return elements, math.ceil(elements * dtype.itemsize)
    except TypeError:  # strings have no item size
        return None


def _output_dims(node: ir.Node) -> list[int] | None:
    op = node.op_type if node.domain in _STANDARD else None
    inputs = list(node.inputs) + [None, None, None]
    try:
        if op == "ConstantOfShape":
            return _ints(inputs[0])
        if op == "Expand":
            dims, shape = _dims(inputs[0]), _ints(inputs[1])
            if dims is None or shape is None:
                return None
            return list(np.broadcast_shapes(tuple(dims), tuple(shape)))
        if op == "Tile":
            dims, repeats = _dims(inputs[0]), _ints(inputs[1])
            if dims is None or repeats is None or len(dims) != len(repeats):
                return None
            return [d * r for d, r in zip(dims, repeats, strict=True)]
        if op == "Range":
            start, limit, delta = (_scalar(v) for v in inputs[:3])
            if start is None or limit is None or not delta:
                return None
            return [max(math.ceil((limit - start) / delta), 0)]
    except (ValueError, OverflowError):  # shapes that do not broadcast: its own error later
        return None
    shape = node.outputs[0].shape
    if shape is None or not shape.is_static():
        return None
    return [int(d) for d in shape.dims]


def _output_dtype(node: ir.Node) -> ir.DataType | None:
    op = node.op_type if node.domain in _STANDARD else None
    if op == "ConstantOfShape":
        value = node.attributes.get("value")
        if value is None or value.is_ref() or value.value is None:
            return ir.DataType.FLOAT  # the spec's default: a float32 zero
        return value.value.dtype
    if op in ("Expand", "Tile", "Range") and node.inputs and node.inputs[0] is not None:
        tensor = node.inputs[0].const_value
        return tensor.dtype if tensor is not None else None
    return node.outputs[0].dtype


def _dims(value: ir.Value | None) -> list[int] | None:
    if value is None or value.const_value is None:
        return None
    return [int(d) for d in value.const_value.shape.dims]


def _ints(value: ir.Value | None) -> list[int] | None:
    tensor = value.const_value if value is not None else None
    if tensor is None or tensor.size > _SMALL:
        return None
    array = tensor.numpy()
    if array.dtype.kind not in "iu":
        return None
    return [int(x) for x in array.reshape(-1)]


def _scalar(value: ir.Value | None) -> float | None:
    tensor = value.const_value if value is not None else None
    if tensor is None or tensor.size != 1:
        return None
    array = tensor.numpy()
    return float(array.reshape(-1)[0]) if array.dtype.kind in "iuf" else None


def _freed_bytes(node: ir.Node) -> int:
    """Bytes of the constants that leave the model with ``node``: its tensor attributes
    (ConstantOfShape's value) and the inputs it alone reads, not graph inputs or outputs."""
    seen: dict[int, int] = {}
    for v in node.inputs:
        if v is None or v.const_value is None or id(v) in seen:
            continue
        if len(v.uses()) == 1 and not v.is_graph_input() and not v.is_graph_output():
            seen[id(v)] = v.const_value.nbytes
    attributes = sum(
        a.value.nbytes
        for a in node.attributes.values()
        if not a.is_ref() and a.type == ir.AttributeType.TENSOR and a.value is not None
    )
    return sum(seen.values()) + attributes


def _single_use_elements(node: ir.Node) -> int:
    """onnxscript's allowance over its per-tensor limit: a value may exceed it by no
    more than the elements of the constant inputs only this node reads."""
    return sum(
        v.const_value.size
        for v in node.inputs
        if v is not None and v.const_value is not None and len(v.uses()) == 1
    )
