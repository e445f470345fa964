"""``layer_norm``: layer normalization over the last axis
(https://onnx.ai/onnx/operators/onnx__LayerNormalization.html)::

    mean = ReduceMean(x, axes=[-1], keepdims=1)
    d    = x - mean
    var  = ReduceMean(Pow(d, 2))
    y    = d * Reciprocal(Sqrt(var + eps))
         = LayerNormalization(x, Scale=1, axis=-1, epsilon=eps)

The canonical rule ``norm_spelling`` writes the other spellings (``d * d``,
``d / Sqrt(.)``, ``Pow(., -0.5)``, ``x + Neg(mean)``, ``ReduceSum / N``, no epsilon) in
this one before the pattern reads it.

LayerNormalization is standard ONNX from opset 17. onnxruntime also registers its own
LayerNormalization in the ONNX domain from version 1, so on the ``onnxruntime`` target a
model below opset 17 gets it too: such a model runs in onnxruntime, but ``onnx.checker``
rejects it ("No Op registered for LayerNormalization with domain_version of 13").

Only float32 is fused. fp16 models often wrap the written-out form in Casts to float32;
those Casts are not part of the patterns.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.patterns import Match
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

__all__ = ["LAYER_NORM_OPSET", "LayerNorm"]

LAYER_NORM_OPSET = 17


class LayerNormParams(Params):
    mean_node: str = "mean"  # ReduceMean(x)
    variance_node: str = "var"  # ReduceMean of the squared difference
    epsilon_node: str = "eps"  # Add(var, eps)
    output_node: str = "norm"  # the normalized value


class LayerNorm(Rewriter):
    name = "layer_norm"
    Params = LayerNormParams

    def rewrite(self, match: Match, params: LayerNormParams, ctx: RewriteContext) -> Rewrite | str:
        if ctx.opset < LAYER_NORM_OPSET and not runs_onnxruntime(ctx):
            return opset_refusal("LayerNormalization", LAYER_NORM_OPSET, ctx)
        mean = match.node(params.mean_node)
        x = mean.inputs[0]
        reductions = [mean, match.node(params.variance_node)]
        stats = statistics(match, x, reductions, params.epsilon_node)
        if isinstance(stats, str):
            return stats
        hidden, eps = stats
        scale = ctx.initializer(f"{x.name or 'x'}_ln_scale", np.ones(hidden, dtype_of(x)))
        node = ir.Node("", "LayerNormalization", [x, scale], norm_attributes(eps))
        return Rewrite([node], [(match.node(params.output_node).outputs[0], node.outputs[0])])
