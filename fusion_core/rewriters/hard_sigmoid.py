"""``hard_sigmoid``: MobileNetV3's piecewise-linear activations HardSigmoid and
HardSwish, written out with Add/Clip/Div/Mul, become ONNX's own ops.

::

    HardSigmoid(x) = Clip(x + 3, 0, 6) / 6 = max(0, min(1, x / 6 + 0.5))
    HardSwish(x)   = x * HardSigmoid(x)

that is ONNX ``HardSigmoid`` with ``alpha = 1/6``, ``beta = 0.5`` (opset 6 and later,
https://onnx.ai/onnx/operators/onnx__HardSigmoid.html) and ``HardSwish`` (opset 14 and
later, https://onnx.ai/onnx/operators/onnx__HardSwish.html, whose function body is
``HardSigmoid(alpha=1/6, beta=0.5)(X) * X``).

Models written as ``x * relu6(x + 3) / 6`` (YOLOv5's export-friendly ``Hardswish``,
older MobileNetV3 ports) export it as ``Add(x, 3)``, ``Clip(0, 6)``, a ``Div`` by 6 or a
``Mul`` by 1/6, and (HardSwish) a ``Mul`` by ``x`` before or after the scaling. The
patterns (``patterns/builtin/hardswish.yaml``, ``hardsigmoid.yaml``) check the shift and
the scale; this module checks what a constraint cannot say: the Clip bounds are 0 and
6 (inputs from opset 11, attributes before), and the Mul's other operand is ``x``
itself.

``hard_sigmoid`` emits, on both targets, ``HardSigmoid(x)`` or, with ``multiply_node``,
HardSwish: ``HardSwish(x)`` on ``generic`` at opset >= 14, else
``Mul(x, HardSigmoid(x))``. onnxruntime 1.32 has no HardSwish kernel of its own on CPU:
it runs the function body, the same HardSigmoid + Mul, so the ``onnxruntime`` target
emits that pair at every opset (measured, docs/benchmarks.md, section 8). A HardSigmoid
after a Conv then becomes ``com.microsoft.FusedConv`` with ``activation = HardSigmoid``
on onnxruntime (``fuse_activation``, next round).

``hard_swish`` (its own module) takes a HardSigmoid already fused, ``x * HardSigmoid(x)``,
to ``HardSwish`` on ``generic``.
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
from autofusion.fusion_core.rewriters.fuse_activation import clip_bounds
from autofusion.fusion_core.rewriters.hard_swish import HARDSWISH_OPSET
from autofusion.fusion_core.rewriters.silu import other_operand
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["HARDSIGMOID_OPSET", "FuseHardSigmoid"]

HARDSIGMOID_OPSET = 6  # HardSigmoid-1 still has the legacy consumed_inputs attribute
ALPHA, BETA = 1.0 / 6.0, 0.5
CLIP_BOUNDS = [0.0, 6.0]


class HardSigmoidParams(Params):
    input: str = "$x"
    clip_node: str = "clip"
    # HardSwish: the Mul of x by the clipped value (before the scaling) or by the
    # HardSigmoid (after it).
    multiply_node: str | None = None
    output_node: str = "out"


class FuseHardSigmoid(Rewriter):
    name = "hard_sigmoid"
    Params = HardSigmoidParams

    def rewrite(
        self, match: Match, params: HardSigmoidParams, ctx: RewriteContext
    ) -> Rewrite | str:
        clip = match.node(params.clip_node)
        bounds = clip_bounds(clip)
        if isinstance(bounds, str):
            return bounds
        if bounds != CLIP_BOUNDS:
            return f"Clip {clip.name!r} clips to {bounds}, expected {CLIP_BOUNDS} (ReLU6)"
        x = match.value(params.input)
        if params.multiply_node is not None:
            reason = _multiplies_x(match, params.multiply_node, x)
            if reason is not None:
                return f"not a HardSwish: {reason}"
        if ctx.opset < HARDSIGMOID_OPSET:
            return opset_refusal("HardSigmoid with alpha and beta", HARDSIGMOID_OPSET, ctx)
        out = match.node(params.output_node).outputs[0]
        if params.multiply_node is None:
            nodes = [_hard_sigmoid(x)]
        elif not ctx.target.can_emit(MS_DOMAIN) and ctx.opset >= HARDSWISH_OPSET:
            nodes = [ir.Node("", "HardSwish", [x])]
        else:
            nodes = _hard_sigmoid_mul(x)
        return Rewrite(nodes, [(out, nodes[-1].outputs[0])])


def _multiplies_x(match: Match, mul_node: str, x: ir.Value | None) -> str | None:
    """Why the Mul ``mul_node`` is not ``x`` times a value of the chain, or None."""
    members = {id(n) for n in match.nodes.values()}
    mul = match.node(mul_node)
    inner = [v for v in mul.inputs if v is not None and id(v.producer()) in members]
    if len(inner) != 1:
        return f"{mul_node} (Mul -> {mul.outputs[0].name!r}) does not read the chain once"
    return other_operand(match, mul_node, inner[0], x)


def _hard_sigmoid(x: ir.Value) -> ir.Node:
    attrs = [ir.AttrFloat32("alpha", ALPHA), ir.AttrFloat32("beta", BETA)]
    return ir.Node("", "HardSigmoid", [x], attrs)


def _hard_sigmoid_mul(x: ir.Value) -> list[ir.Node]:
    hsig = _hard_sigmoid(x)
    gate = hsig.outputs[0]
    gate.type, gate.shape = x.type, x.shape
    return [hsig, ir.Node("", "Mul", [x, gate])]
