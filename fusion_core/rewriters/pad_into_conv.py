"""``pad_into_conv``: a zero ``Pad`` of the spatial axes before a Conv becomes the
Conv's own ``pads`` (https://onnx.ai/onnx/operators/onnx__Pad.html,
https://onnx.ai/onnx/operators/onnx__Conv.html)::

    Conv(Pad(x, p)).pads = conv_pads + p     (per spatial axis, begin and end)

Only ``mode=constant`` with value 0 and non-negative pads qualify, and the batch and
channel axes must not be padded. The pads are read from the ``pads`` input (opset >= 11,
with optional ``axes`` from opset 18) or the attribute (older opsets).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    copy_attributes,
)

__all__ = ["PadIntoConv"]


class PadIntoConvParams(Params):
    pad_node: str = "pad"
    conv_node: str = "conv"


class PadIntoConv(Rewriter):
    name = "pad_into_conv"
    Params = PadIntoConvParams

    def rewrite(
        self, match: Match, params: PadIntoConvParams, ctx: RewriteContext
    ) -> Rewrite | str:
        pad, conv = match.node(params.pad_node), match.node(params.conv_node)
        rank = len(conv.inputs[1].shape) if conv.inputs[1].shape is not None else None
        if rank is None:
            return f"the rank of the weight of Conv {conv.name!r} is unknown"
        pads = _full_pads(pad, rank)
        if isinstance(pads, str):
            return pads
        begin, end = pads[:rank], pads[rank:]
        if begin[0] or begin[1] or end[0] or end[1]:
            return f"Pad {pad.name!r} pads the batch or channel axis"
        if (pads < 0).any():
            return f"Pad {pad.name!r} has negative pads (a crop)"
        spatial = rank - 2
        conv_pads = np.array(attribute_value(conv, "pads", [0] * (2 * spatial)), dtype=np.int64)
        new_pads = conv_pads + np.concatenate([begin[2:], end[2:]])
        attributes = copy_attributes(conv, drop=("pads",))
        attributes.append(ir.AttrInt64s("pads", [int(p) for p in new_pads]))
        new_conv = ir.Node(
            "", "Conv", [pad.inputs[0], *conv.inputs[1:]], attributes, name=conv.name
        )
        return Rewrite([new_conv], [(conv.outputs[0], new_conv.outputs[0])])


def _full_pads(pad: ir.Node, rank: int) -> np.ndarray | str:
    """The pads as ``[b_1..b_rank, e_1..e_rank]`` over all axes, or why not known."""
    if pad.attributes.get("pads") is not None:  # opset < 11
        value = float(attribute_value(pad, "value", 0.0))
        if value != 0.0:
            return f"Pad {pad.name!r} pads with {value}, not 0"
        return np.array(attribute_value(pad, "pads"), dtype=np.int64)
    pads = constant_array(pad.inputs[1]) if len(pad.inputs) > 1 else None
    if pads is None:
        return f"the pads of Pad {pad.name!r} are not constant"
    fill = pad.inputs[2] if len(pad.inputs) > 2 else None
    if fill is not None:
        fill_value = constant_array(fill)
        if fill_value is None or np.any(fill_value != 0):
            return f"Pad {pad.name!r} does not pad with a constant 0"
    pads = pads.astype(np.int64).reshape(-1)
    axes_value = pad.inputs[3] if len(pad.inputs) > 3 else None
    if axes_value is None:
        return pads if pads.size == 2 * rank else f"Pad {pad.name!r} pads {pads.size // 2} axes"
    axes = constant_array(axes_value)
    if axes is None:
        return f"the axes of Pad {pad.name!r} are not constant"
    full = np.zeros(2 * rank, dtype=np.int64)
    for k, axis in enumerate(axes.reshape(-1)):
        axis = int(axis) % rank
        full[axis], full[rank + axis] = pads[k], pads[len(axes.reshape(-1)) + k]
    return full
