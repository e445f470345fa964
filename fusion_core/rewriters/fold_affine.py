"""``fold_affine``: a constant per-channel Mul, Div, Add or Sub after a Conv (or
ConvTranspose, Gemm, MatMul) folds into its weights and bias::

    Mul c:  W' = W * c,  b' = b * c        Div c:  W' = W / c,  b' = b / c
    Add d:  b' = b + d                     Sub d:  b' = b - d

(the Conv output must be the Sub/Div's first input; the pattern says so). The pattern's
``channelwise`` constraint guarantees the constant is a scalar or varies only along the
channel axis, so the map is per channel. See ``_affine`` for the folding.
"""

from __future__ import annotations

import numpy as np

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._affine import fold_into_producer
from autofusion.fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter
from autofusion.fusion_core.rewriters._effect import RewriteEffect, matched, present

__all__ = ["FoldAffine"]


class FoldAffineParams(Params):
    producer_node: str = "conv"
    affine_node: str = "op"


class FoldAffine(Rewriter):
    name = "fold_affine"
    Params = FoldAffineParams

    def cost_effect(self, match: Match, params: FoldAffineParams) -> RewriteEffect:
        # the Mul/Add folds into the producer's constant weights: its FLOPs go
        return RewriteEffect(matched(match), present(match, params.affine_node))

    def rewrite(self, match: Match, params: FoldAffineParams, ctx: RewriteContext) -> Rewrite | str:
        op = match.node(params.affine_node)
        producer_out = match.node(params.producer_node).outputs[0]
        other = [v for v in op.inputs if v is not producer_out]
        constant = constant_array(other[0]) if len(other) == 1 else None
        if constant is None:
            return f"the other input of {op.op_type} {op.name!r} is not a constant"
        if op.op_type in ("Sub", "Div") and op.inputs[0] is not producer_out:
            return f"{op.op_type} {op.name!r} takes the producer as its second input"
        c = constant.astype(np.float64)
        if op.op_type in ("Div",) and np.any(c == 0):
            return f"Div {op.name!r} divides by zero"
        scale, shift = {
            "Mul": (c, np.zeros(1)),
            "Div": (1.0 / c, np.zeros(1)),
            "Add": (np.ones(1), c),
            "Sub": (np.ones(1), -c),
        }[op.op_type]
        folded = fold_into_producer(match.node(params.producer_node), scale, shift, ctx)
        if isinstance(folded, str):
            return folded
        node = folded.build()
        return Rewrite([node], [(op.outputs[0], node.outputs[0])])
