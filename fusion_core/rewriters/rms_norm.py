"""``rms_norm``: RMS normalization over the last axis
(https://onnx.ai/onnx/operators/onnx__RMSNormalization.html)::

    r = Sqrt(ReduceMean(Pow(x, 2), axes=[-1]) + eps)
    y = x * Reciprocal(r) * gamma
      = RMSNormalization(x, gamma, axis=-1, epsilon=eps)                 (opset >= 23)
      = SimplifiedLayerNormalization(x, gamma, axis=-1, epsilon=eps)     (onnxruntime)

The canonical rule ``norm_spelling`` writes the other spellings (``x / r``,
``x * (1 / r)``, ``x * Pow(v + eps, -0.5)``, ``Mul(x, x)``, ``ReduceSum / N``, no
epsilon: ``eps = 0``) in this one before the patterns read it.

SimplifiedLayerNormalization is onnxruntime's own op, registered in the ONNX domain (not
``com.microsoft``); ``onnx.checker`` rejects it at every opset. Without ``gamma``
the scale is 1.

The norm is computed in float32. An fp16 model computes it between two Casts, as
transformers' ``LlamaRMSNorm`` writes it (``x.to(float32)``, the norm, ``.to(float16)``,
then gamma in fp16); the patterns' optional group ``widened`` takes both Casts, and the
fused op reads and writes the fp16 ``x`` itself, gamma in fp16: onnxruntime's fp16
kernel (and RMSNormalization's ``stash_type`` 1) normalize in float32 too, and round
once where the graph rounds twice (the norm, then its product with gamma).
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
    widen_node: str | None = None  # Cast(x, float32), the group ``widened``
    narrow_node: str | None = None  # Cast(norm, x's type) back, the group ``widened``


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
        x = _normalized(match, params)
        if isinstance(x, str):
            return x
        stats = statistics(match, x, [match.node(params.variance_node)], params.epsilon_node)
        if isinstance(stats, str):
            return stats
        hidden, eps = stats
        gamma = self._gamma(match, params, hidden)
        if isinstance(gamma, str):
            return gamma
        scale = ctx.initializer(f"{x.name or 'x'}_rms_scale", gamma.astype(dtype_of(x)))
        node = ir.Node("", op_type, [x, scale], norm_attributes(eps))
        last = match.node(params.scale_node or params.narrow_node or params.output_node)
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


def _normalized(match: Match, params: RMSNormParams) -> ir.Value | str:
    """The input the fused op normalizes: ``x`` itself, or the ``x`` widened to float32
    by the group's Cast when the other Cast narrows the norm back to ``x``'s type."""
    if params.widen_node is None or params.narrow_node is None:
        return match.node(params.square_node).inputs[0]
    x = match.node(params.widen_node).inputs[0]
    narrowed = match.node(params.narrow_node).outputs[0]
    if x is None or x.dtype is None or narrowed.dtype != x.dtype:
        shown = narrowed.dtype.name if narrowed.dtype is not None else "unknown"
        name = x.name if x is not None else None
        return f"the norm is cast back to {shown}, not to the type of its input {name!r}"
    return x
