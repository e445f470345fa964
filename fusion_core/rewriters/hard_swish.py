"""``hard_swish`` takes ``x * HardSigmoid(x)`` (alpha 1/6, beta 0.5: the pattern checks
them; TorchScript exports ``nn.Hardswish`` so below opset 14) to ``HardSwish`` on
``generic`` at opset >= 14; below it the model keeps the pair and the reason names
``--upgrade-opset 14``.

::

    HardSwish(x) = x * HardSigmoid(x)

that is ONNX ``HardSwish`` (opset 14 and later,
https://onnx.ai/onnx/operators/onnx__HardSwish.html, whose function body is
``HardSigmoid(alpha=1/6, beta=0.5)(X) * X``). ``hard_sigmoid`` fuses the written-out
forms (``Clip(x + 3, 0, 6) / 6``, times ``x``).
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
)
from autofusion.fusion_core.rewriters.silu import gated_input

__all__ = ["HARDSWISH_OPSET", "FuseHardSwish"]

HARDSWISH_OPSET = 14


class HardSwishParams(Params):
    hard_sigmoid_node: str = "hsig"
    output_node: str = "out"  # the Mul by x


class FuseHardSwish(Rewriter):
    name = "hard_swish"
    targets = frozenset({"generic"})
    Params = HardSwishParams

    def rewrite(self, match: Match, params: HardSwishParams, ctx: RewriteContext) -> Rewrite | str:
        x = gated_input(match, params.hard_sigmoid_node, params.output_node, "HardSwish")
        if isinstance(x, str):
            return x
        if ctx.opset < HARDSWISH_OPSET:
            return opset_refusal("ONNX HardSwish", HARDSWISH_OPSET, ctx)
        node = ir.Node("", "HardSwish", [x])
        out = match.node(params.output_node)
        return Rewrite([node], [(out.outputs[0], node.outputs[0])])
