"""``pool_bn``: ``BN(MaxPool(Conv(x)))`` with every ``s > 0``, where
``s = gamma / sqrt(var + eps)`` is the BN's per-channel scale. A per-channel map with a
positive scale is strictly increasing, so it commutes with max:
``BN(max(window)) == max(BN(window))``; the BN moves before the pool and folds into the
Conv. Padding does not break this: MaxPool ignores padded positions
(https://onnx.ai/onnx/operators/onnx__MaxPool.html). See ``_affine`` for the folding.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._affine import batchnorm_scale_shift, fold_into_producer
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    copy_attributes,
)
from autofusion.fusion_core.rewriters._effect import RewriteEffect, present

__all__ = ["PoolBatchNorm"]


class PoolBatchNormParams(Params):
    conv_node: str = "conv"
    pool_node: str = "pool"
    batchnorm_node: str = "bn"


class PoolBatchNorm(Rewriter):
    name = "pool_bn"
    Params = PoolBatchNormParams

    def rewrite(
        self, match: Match, params: PoolBatchNormParams, ctx: RewriteContext
    ) -> Rewrite | str:
        bn, pool = match.node(params.batchnorm_node), match.node(params.pool_node)
        affine = batchnorm_scale_shift(bn)
        if isinstance(affine, str):
            return affine
        scale, shift = affine
        if not (scale > 0).all():
            return (
                f"BatchNormalization {bn.name!r} has a non-positive scale: "
                "it does not commute with max"
            )
        folded = fold_into_producer(match.node(params.conv_node), scale, shift, ctx)
        if isinstance(folded, str):
            return folded
        conv = folded.build()
        new_pool = ir.Node("", "MaxPool", [conv.outputs[0]], copy_attributes(pool), name=pool.name)
        return Rewrite([conv, new_pool], [(bn.outputs[0], new_pool.outputs[0])])

    def cost_effect(self, match: Match, params: PoolBatchNormParams) -> RewriteEffect:
        # The Conv stays as it was: only the pool and the BatchNormalization form the
        # group, the BatchNormalization's FLOPs go and the pool writes the final output.
        bn = present(match, params.batchnorm_node)
        return RewriteEffect(present(match, params.pool_node, *bn), bn)
