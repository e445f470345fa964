"""``rms_norm``: RMS normalization over the last axis
(https://onnx.ai/onnx/operators/onnx__RMSNormalization.html)::

    r = Sqrt(ReduceMean(Pow(x, 2), axes=[-1]) + eps)
    y = x / r * gamma  or  x * Reciprocal(r) * gamma  or  x * (1 / r) * gamma
      = RMSNormalization(x, gamma, axis=-1, epsilon=eps)                 (opset >= 23)
      = SimplifiedLayerNormalization(x, gamma, axis=-1, epsilon=eps)     (onnxruntime)

SimplifiedLayerNormalization is onnxruntime's own op, registered in the ONNX domain (not
``com.microsoft``); ``onnx.checker`` rejects it at every opset. Without ``gamma``
the scale is 1.

Only float32 is fused. fp16 models often wrap the written-out form in Casts to float32;
those Casts are not part of the patterns.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._affine import per_channel
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
)
from autofusion.fusion_core.rewriters._norm import (
    dtype_of,
    norm_attributes,
    runs_onnxruntime,
    statistics,
)

__all__ = ["RMS_NORM_OPSET", "RMSNorm"]

RMS_NORM_OPSET = 23


class RMSNormParams(Params):
    square_node: str = "sq"  # Pow(x, 2)
    variance_node: str = "var"  # ReduceMean of the squares
    epsilon_node: str = "eps"  # Add(var, eps)
    output_node: str = "norm"  # x / rms or x * (1 / rms)
    scale_node: str | None = None  # Mul(norm, gamma), if the pattern has one


class RMSNorm(Rewriter):
    name = "rms_norm"
    Params = RMSNormParams

    def rewrite(self, match: Match, params: RMSNormParams, ctx: RewriteContext) -> Rewrite | str:
        if ctx.opset >= RMS_NORM_OPSET:
            op_type = "RMSNormalization"
        elif runs_onnxruntime(ctx):
            op_type = "SimplifiedLayerNormalization"
        else:
            return opset_refusal("RMSNormalization", RMS_NORM_OPSET, ctx)
        x = match.node(params.square_node).inputs[0]
        stats = statistics(match, x, [match.node(params.variance_node)], params.epsilon_node)
        if isinstance(stats, str):
            return stats
        hidden, eps = stats
        gamma = self._gamma(match, params, hidden)
        if isinstance(gamma, str):
            return gamma
        scale = ctx.initializer(f"{x.name or 'x'}_rms_scale", gamma.astype(dtype_of(x)))
        node = ir.Node("", op_type, [x, scale], norm_attributes(eps))
        last = match.node(params.scale_node or params.output_node)
        return Rewrite([node], [(last.outputs[0], node.outputs[0])])

    @staticmethod
    def _gamma(match: Match, params: RMSNormParams, hidden: int) -> np.ndarray | str:
        if params.scale_node is None:
            return np.ones(hidden)
        value = match.input(params.scale_node, 1)
        array = constant_array(value)
        gamma = per_channel(array, hidden) if array is not None else None
        if gamma is None:
            name = value.name if value is not None else "?"
            return f"the scale {name!r} is not a constant with one value per feature ({hidden})"
        return gamma
