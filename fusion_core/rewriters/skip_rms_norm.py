"""``skip_rms_norm`` (onnxruntime only): a residual Add before an RMS normalization
(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.SkipSimplifiedLayerNormalization)::

    s = input + skip
    y = SimplifiedLayerNormalization(s, gamma, axis=-1, epsilon=eps)   (or RMSNormalization)
      = SkipSimplifiedLayerNormalization(input, skip, gamma, epsilon=eps)   -> (y, _, _, s)

The decoders' pre-norm block: its fourth output ``input_skip_bias_sum`` is ``s``, which
in a decoder also feeds the next residual Add; that Add (or the fused node it became in
an earlier round) is re-created reading it, as ``skip_layer_norm`` does for pre-LN
encoders. The RMS norm is ``rms_norm``'s output of an earlier round. The kernel has no
bias that also enters the sum as this one is written, so no bias Add is taken; the
input is the full-shape operand (the kernel broadcasts only ``skip``, to [1, S, H] or
[S, H]). A separate rewriter from ``skip_layer_norm``: its kernel is not that one, and
the cost model's kernel factors are per rewriter.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter
from autofusion.fusion_core.rewriters._effect import RewriteEffect
from autofusion.fusion_core.rewriters._norm import normalizes_last_axis
from autofusion.fusion_core.rewriters.skip_layer_norm import (
    input_and_skip,
    pre_ln_effect,
    skip_rewrite,
    unname_unused,
)
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["SkipRMSNorm"]

RMS_EPSILON = 1e-5  # the default of SimplifiedLayerNormalization and RMSNormalization


class SkipRMSNormParams(Params):
    add_node: str = "add"  # the residual Add feeding the RMS norm
    norm_node: str = "ln"  # SimplifiedLayerNormalization or RMSNormalization
    # The other reader of the sum (the next residual Add, or the fused node it became);
    # it is re-created reading input_skip_bias_sum.
    next_node: str | None = None


class SkipRMSNorm(Rewriter):
    name = "skip_rms_norm"
    targets = frozenset({"onnxruntime"})
    Params = SkipRMSNormParams

    def cost_effect(self, match: Match, params: SkipRMSNormParams) -> RewriteEffect:
        return pre_ln_effect(match, params.next_node)

    def rewrite(
        self, match: Match, params: SkipRMSNormParams, ctx: RewriteContext
    ) -> Rewrite | str:
        norm, add = match.node(params.norm_node), match.node(params.add_node)
        failure = normalizes_last_axis(norm)
        if failure is not None:
            return failure
        first, second = match.input(params.add_node, 0), match.input(params.add_node, 1)
        if first is None or second is None:
            return f"Add {add.name!r} has a missing input"
        pair = input_and_skip(first, second, add)
        if isinstance(pair, str):
            return pair
        ctx.use_domain(MS_DOMAIN)
        eps = float(attribute_value(norm, "epsilon", RMS_EPSILON))
        node = ir.Node(
            MS_DOMAIN,
            "SkipSimplifiedLayerNormalization",
            [*pair, norm.inputs[1]],
            [ir.AttrFloat32("epsilon", eps)],
            num_outputs=4 if params.next_node is not None else 1,
        )
        unname_unused(node)
        return skip_rewrite(match, node, norm, add, params.next_node)
