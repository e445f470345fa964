"""The way from heads read in another order back to their projection, for rule
``interleaved_columns`` (``_interleaved_columns.py``) and its write-back
(``_interleaved_undo.py``): which constants to permute so the heads come out permuted.

``MatMul(h, W)[..., order] == MatMul(h, W[:, order])``; a bias, a scale, a Transpose
that keeps the last axis last, a Split or step-1 Slice of the last axis and a Reshape
whose last axis divides its input's carry the order to the columns before them (the
rule's docstring has the math). The rule walks it to permute; the write-back walks it
again to prove the way is still the one the rule permuted (the same nodes, each value
on it read only by the next op, a Shape, or a Slice of columns the order leaves in
place), so un-permuting cannot change what anything else reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims, scalar

__all__ = ["ONNX", "Projection", "projection", "slice_columns"]

ONNX = ("", "ai.onnx")
_WALK = 8  # ops from the picks back to the projection, at most
_ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div"})


@dataclass
class Projection:
    """The constants to permute, each ``(node, input, columns)``, the MatMul's weight
    last; and every node on the way from the heads back to that MatMul."""

    constants: list[tuple[ir.Node, int, np.ndarray]]
    way: list[ir.Node]


def projection(heads: ir.Value, order: np.ndarray) -> Projection | None:
    """What to permute so ``heads`` comes out as ``heads[..., order]``; None where the way
    back to a MatMul with a constant weight is not one of the module's ops, or a value
    on it is read elsewhere (that reader would see the columns moved)."""
    value, columns, reader = heads, order, None
    found: list[tuple[ir.Node, int, np.ndarray]] = []
    way: list[ir.Node] = []
    for _ in range(_WALK):
        if reader is not None and not _read_only_by(value, reader, columns):
            return None
        node = value.producer()
        if node is None or node.domain not in ONNX or value.is_graph_output():
            return None
        way.append(node)
        if node.op_type == "MatMul":
            weight = constant_array(node.inputs[1])
            if weight is None or weight.ndim != 2 or weight.shape[1] != columns.size:
                return None
            return Projection([*found, (node, 1, columns)], way)
        step = _carried(node, value, columns)
        if step is None:
            return None
        value, columns, constants = step
        found += constants
        reader = node
    return None


def slice_columns(node: ir.Node, size: int, rank: int) -> list[int] | None:
    """The columns a Slice of the last axis reads (constant bounds, a positive step)."""
    if len(node.inputs) < 4 or node.inputs[3] is None:
        return None  # no axes: the Slice reads the first axes
    start, end, axis = (scalar(v) for v in node.inputs[1:4])
    step = scalar(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else 1
    if start is None or end is None or axis not in (-1, rank - 1) or step is None or step < 1:
        return None
    return list(range(size)[start:end:step])  # Python's clamping is ONNX's for step > 0


def _read_only_by(value: ir.Value, reader: ir.Node, columns: np.ndarray) -> bool:
    """Whether ``reader``, Shapes and Slices of columns the order leaves in place
    (``columns[c] == c``: a multi-head latent attention's nope part sliced beside the
    rope part) are all that read ``value``, whose last axis is read in the order
    ``columns``."""
    if value.is_graph_output():
        return False
    dims = known_dims(value)
    for use in value.uses():
        node = use.node
        if node is reader or node.op_type == "Shape":
            continue
        if node.op_type != "Slice" or node.domain not in ONNX or use.idx != 0 or dims is None:
            return False
        kept = slice_columns(node, columns.size, len(dims))
        if not kept or dims[-1] != columns.size or any(columns[c] != c for c in kept):
            return False
    return True


def _carried(
    node: ir.Node, value: ir.Value, columns: np.ndarray
) -> tuple[ir.Value, np.ndarray, list] | None:
    """(the input, its columns, a constant to permute) for ``node``'s ``value`` read in the
    order ``columns``, where ``node`` carries the last axis (the module's list)."""
    if node.op_type in _ELEMENTWISE:
        return _with_constant(node, columns)
    source = node.inputs[0]
    outer = known_dims(source)
    if source is None or outer is None or not outer or not isinstance(outer[-1], int):
        return None
    width, rank = outer[-1], len(outer)
    if node.op_type == "Transpose":
        perm = attribute_value(node, "perm", None)
        kept = perm and perm[-1] == rank - 1 and width == columns.size
        return (source, columns, []) if kept else None
    if node.op_type == "Reshape":
        size = columns.size
        if width % size:
            return None
        inner = np.arange(width)
        return source, (inner // size) * size + columns[inner % size], []
    if node.op_type in ("Split", "Slice"):
        start = _offset(node, value, width, rank)
        if start is None:
            return None
        whole = np.arange(width)
        whole[start : start + columns.size] = start + columns
        return source, whole, []
    return None


def _offset(node: ir.Node, value: ir.Value, width: int, rank: int) -> int | None:
    """Where ``value`` starts among the columns of the Split or step-1 Slice computing it
    from the last axis of its input."""
    if node.op_type == "Slice":
        columns = slice_columns(node, width, rank)
        contiguous = columns and columns == list(range(columns[0], columns[0] + len(columns)))
        return columns[0] if contiguous else None  # type: ignore[index]
    if attribute_value(node, "axis", 0) not in (-1, rank - 1):
        return None
    start = 0
    for out in node.outputs:
        if out is value:
            return start
        dims = known_dims(out)
        if dims is None or not isinstance(dims[-1], int):
            return None
        start += dims[-1]
    return None


def _with_constant(node: ir.Node, columns: np.ndarray) -> tuple[ir.Value, np.ndarray, list] | None:
    """``y op b`` (elementwise) with ``b`` constant: (``y``, the same columns, ``b`` to
    permute where it has a column each; one for all columns stays). ``y`` has the
    columns itself (it is not broadcast over them)."""
    constant = [constant_array(v) is not None for v in node.inputs]
    if len(node.inputs) != 2 or constant.count(True) != 1:
        return None
    at = constant.index(True)
    other, source = constant_array(node.inputs[at]), node.inputs[1 - at]
    dims = known_dims(source)
    if other is None or source is None or dims is None or not dims or dims[-1] != columns.size:
        return None
    if other.ndim == 0 or other.shape[-1] == 1:
        return source, columns, []
    return (source, columns, [(node, at, columns)]) if other.shape[-1] == columns.size else None
