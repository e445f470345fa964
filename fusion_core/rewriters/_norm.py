"""What the normalization rewriters share (``layer_norm``, ``rms_norm``,
``fold_layer_norm_affine``, ``skip_layer_norm``): which axes a ReduceMean reduces, the
hidden size and epsilon of a written-out normalization, and the attributes of the fused op.

Only float32 is fused. fp16 models often wrap the written-out form in Casts to float32;
those Casts are not part of the patterns.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = [
    "dtype_of",
    "hidden_size",
    "norm_attributes",
    "normalizes_last_axis",
    "runs_onnxruntime",
    "statistics",
]


def runs_onnxruntime(ctx: RewriteContext) -> bool:
    # onnxruntime's own ONNX-domain kernels (LayerNormalization below opset 17,
    # SimplifiedLayerNormalization) come with the target that may emit its contrib ops.
    return ctx.target.can_emit(MS_DOMAIN)


def _reduction_axes(node: ir.Node) -> list[int] | None | str:
    """The axes a ReduceMean reduces: the attribute (opset < 18) or the constant input 1
    (opset >= 18); None when there are none, which means every axis."""
    attr = node.attributes.get("axes")
    if attr is not None:
        return [int(a) for a in attr.value]
    value = node.inputs[1] if len(node.inputs) > 1 else None
    if value is None:
        return None
    array = constant_array(value)
    if array is None:
        return f"the axes of ReduceMean {node.name!r} are not a constant"
    return [int(a) for a in array.reshape(-1)] or None


def _rank(value: ir.Value) -> int | None:
    return len(value.shape) if value.shape is not None else None


def _reduces_last_axis(node: ir.Node, rank: int | None) -> str | None:
    """None if the ReduceMean reduces exactly the last axis of its rank-``rank`` input."""
    axes = _reduction_axes(node)
    if isinstance(axes, str):
        return axes
    if axes == [-1]:
        return None
    if rank is None:
        return f"the rank of the input of ReduceMean {node.name!r} is unknown"
    reduced = sorted({a % rank for a in axes}) if axes is not None else list(range(rank))
    if reduced != [rank - 1]:
        shown = "all axes" if axes is None else f"axes {axes}"
        return (
            f"ReduceMean {node.name!r} reduces {shown} of a rank-{rank} input, "
            "not only the last axis"
        )
    return None


def normalizes_last_axis(node: ir.Node) -> str | None:
    axis = int(attribute_value(node, "axis", -1))
    rank = _rank(node.inputs[0])
    if axis == -1 or (rank is not None and axis == rank - 1):
        return None
    return f"{node.op_type} {node.name!r} normalizes from axis {axis}, not over the last axis"


def hidden_size(x: ir.Value) -> int | str:
    dim = x.shape[-1] if x.shape is not None and len(x.shape) else None
    if not isinstance(dim, int):
        return f"the last dimension of {x.name!r} is not known"
    return dim


def _epsilon(match: Match, eps_node: str) -> float | str:
    """The scalar added to the variance (input 1 of the pattern's Add node)."""
    value = match.input(eps_node, 1)
    array = constant_array(value)
    if array is None or array.size != 1:
        name = value.name if value is not None else "?"
        return f"epsilon {name!r} of Add {match.node(eps_node).name!r} is not a constant scalar"
    return float(array.reshape(-1)[0])


def statistics(
    match: Match, x: ir.Value, reductions: list[ir.Node], eps_node: str
) -> tuple[int, float] | str:
    """(hidden size, epsilon) of a written-out normalization of ``x``, or why not."""
    rank = _rank(x)
    for node in reductions:
        failure = _reduces_last_axis(node, rank)
        if failure is not None:
            return failure
    hidden = hidden_size(x)
    if isinstance(hidden, str):
        return hidden
    eps = _epsilon(match, eps_node)
    if isinstance(eps, str):
        return eps
    return hidden, eps


def dtype_of(value: ir.Value) -> np.dtype:
    return value.dtype.numpy() if value.dtype is not None else np.dtype(np.float32)


def norm_attributes(eps: float) -> list[ir.Attr]:
    return [ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", eps)]
