"""``fold_batchnorm``: ``BN(producer(x))`` with ``producer`` a Conv, ConvTranspose, Gemm or
MatMul with a constant weight becomes one producer with folded weights (any group
count)::

    s  = gamma / sqrt(var + eps)
    W' = W * s                      (along the output-channel axis)
    b' = (b - mean) * s + beta

See ``_affine`` for the folding.
"""

from __future__ import annotations

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._affine import batchnorm_scale_shift, fold_into_producer
from autofusion.fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter
from autofusion.fusion_core.rewriters._effect import RewriteEffect, matched, present

__all__ = ["FoldBatchNorm"]


class FoldBatchNormParams(Params):
    producer_node: str = "conv"
    batchnorm_node: str = "bn"


class FoldBatchNorm(Rewriter):
    name = "fold_batchnorm"
    Params = FoldBatchNormParams

    def rewrite(
        self, match: Match, params: FoldBatchNormParams, ctx: RewriteContext
    ) -> Rewrite | str:
        bn = match.node(params.batchnorm_node)
        affine = batchnorm_scale_shift(bn)
        if isinstance(affine, str):
            return affine
        folded = fold_into_producer(match.node(params.producer_node), *affine, ctx)
        if isinstance(folded, str):
            return folded
        node = folded.build()
        return Rewrite([node], [(bn.outputs[0], node.outputs[0])])

    def cost_effect(self, match: Match, params: FoldBatchNormParams) -> RewriteEffect:
        # the BatchNormalization folds into the producer's weights: its FLOPs go
        return RewriteEffect(matched(match), present(match, params.batchnorm_node))
