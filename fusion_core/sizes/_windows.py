"""Rules of axis sizes for windows and reductions: Conv and pools (onnx's output size
formula), Pad, the reductions, Tile, GatherElements."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes._size import ONE, Size

if TYPE_CHECKING:
    from autofusion.fusion_core.sizes._proof import SizeProof

__all__ = ["WINDOW_RULES", "axes_of"]


def axes_of(node: ir.Node) -> list[int] | None:
    """The ``axes`` of an Unsqueeze, Squeeze or Reduce: the attribute (before opset 13 or
    18) or the constant second input; None when neither is fixed by the graph."""
    attr = attribute_value(node, "axes", None)
    if attr is not None:
        return list(attr)
    array = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    return None if array is None else [int(a) for a in array.reshape(-1)]


def _reduce(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    """A reduction's axes are 1 (keepdims) or gone; the others keep their size."""
    if node.op_type in ("ArgMax", "ArgMin"):
        axes: list[int] | None = [attribute_value(node, "axis", 0)]
    else:
        axes = axes_of(node)
    keep = attribute_value(node, "keepdims", 1)
    if axes is None or not axes:
        given = len(node.inputs) > 1 and node.inputs[1] is not None
        if given or attribute_value(node, "noop_with_empty_axes", 0):
            return None
        return ONE  # every axis reduced; kept as 1 (without keepdims there is no axis)
    before = rank if keep else rank + len(axes)
    reduced = {a + before if a < 0 else a for a in axes}
    if keep:
        return ONE if axis in reduced else proof.bound(node.inputs[0], axis, depth)
    kept = [a for a in range(before) if a not in reduced]
    return proof.bound(node.inputs[0], kept[axis], depth) if axis < len(kept) else None


def _tile(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    """A size repeated once is itself; a size 1 repeated r times is r."""
    repeats = proof.entries(node.inputs[1], depth)
    if repeats is None or len(repeats) != rank or repeats[axis] is None:
        return None
    if repeats[axis] == ONE:
        return proof.bound(node.inputs[0], axis, depth)
    return repeats[axis] if proof.bound(node.inputs[0], axis, depth) == ONE else None


def _conv(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    """A convolution's or pool's batch is its input's; its channels the weight's (Conv)
    or the input's (pools); a global pool's spatial axes are 1."""
    if axis == 0:
        return proof.bound(node.inputs[0], 0, depth)
    if axis == 1:
        source = node.inputs[1] if node.op_type == "Conv" else node.inputs[0]
        return proof.bound(source, 0 if node.op_type == "Conv" else 1, depth)
    if node.op_type.startswith("Global"):
        return ONE
    return _window(proof, node, axis - 2, depth)


def _window(proof: SizeProof, node: ir.Node, at: int, depth: int) -> Size | None:
    """A spatial axis of a Conv or pool over a number of elements: onnx's formula, for
    explicit pads or VALID, and SAME's ceil(n / stride)."""
    n = proof.size(node.inputs[0], at + 2, depth)
    weight = node.inputs[1] if node.op_type == "Conv" and len(node.inputs) > 1 else None
    kernel = attribute_value(node, "kernel_shape", None)
    if kernel is None and weight is not None and weight.shape is not None:
        kernel = [d if isinstance(d, int) else None for d in list(weight.shape)[2:]]
    if n is None or kernel is None or at >= len(kernel) or kernel[at] is None:
        return None
    spatial = len(kernel)
    strides = attribute_value(node, "strides", None) or [1] * spatial
    dilations = attribute_value(node, "dilations", None) or [1] * spatial
    pads = attribute_value(node, "pads", None) or [0] * 2 * spatial
    auto_pad = attribute_value(node, "auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        return None
    if n.value is None:  # a symbol: stride 1 only, n plus a number
        if strides[at] != 1 or auto_pad.startswith("SAME"):
            return n if strides[at] == 1 else None
        added = pads[at] + pads[at + spatial] if auto_pad == "NOTSET" else 0
        return Size(n.atoms, n.constant + added - dilations[at] * (kernel[at] - 1))
    if auto_pad.startswith("SAME"):
        return Size((), -(-n.value // strides[at]))
    padded = n.value + (pads[at] + pads[at + spatial] if auto_pad == "NOTSET" else 0)
    span = padded - dilations[at] * (kernel[at] - 1) - 1
    if attribute_value(node, "ceil_mode", 0):
        return Size((), -(-span // strides[at]) + 1)
    return Size((), span // strides[at] + 1)


def _pad(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    """``n + before + after`` where the pads on the axis are numbers."""
    pads = proof.entries(node.inputs[1], depth) if len(node.inputs) > 1 else None
    if pads is None and attribute_value(node, "pads", None) is not None:
        pads = [Size((), int(p)) for p in attribute_value(node, "pads", None)]
    axes = constant_array(node.inputs[3]) if len(node.inputs) > 3 else None
    if len(node.inputs) > 3 and node.inputs[3] is not None and axes is None:
        return None
    named = list(range(rank)) if axes is None else [int(a) % rank for a in axes.reshape(-1)]
    if axis not in named:
        return proof.bound(node.inputs[0], axis, depth)
    if pads is None or len(pads) != 2 * len(named):
        return None
    at = named.index(axis)
    before, after, n = pads[at], pads[at + len(named)], proof.size(node.inputs[0], axis, depth)
    if None in (before, after, n) or before.value is None or after.value is None:
        return None
    return Size(n.atoms, n.constant + before.value + after.value)


def _gather_elements(proof: SizeProof, node: ir.Node, axis: int, rank: int, depth: int):
    return proof.bound(node.inputs[1], axis, depth)


_POOLS = ("Conv", "MaxPool", "AveragePool", "LpPool", "GlobalAveragePool", "GlobalMaxPool",
          "GlobalLpPool")  # fmt: skip
_REDUCE = ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1",
           "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax",
           "ArgMin")  # fmt: skip
WINDOW_RULES = {
    **dict.fromkeys(_REDUCE, _reduce),
    **dict.fromkeys(_POOLS, _conv),
    "GatherElements": _gather_elements,
    "Pad": _pad,
    "Tile": _tile,
}
