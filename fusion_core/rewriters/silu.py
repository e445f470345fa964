"""``silu``: SiLU (swish) written out as ``x * Sigmoid(x)`` becomes one op.

::

    SiLU(x) = x * sigmoid(x) = x / (1 + exp(-x))

Exporters write it as ``Sigmoid`` and ``Mul`` (torch's ``nn.SiLU`` with both torch.onnx
exporters, YOLO-style Conv + BatchNormalization + SiLU blocks, EfficientNet), in either
Mul input order. ``x * Sigmoid(alpha * x)`` with a constant ``alpha`` (CLIP's and
OpenAI's ``quick_gelu``, alpha 1.702; the ``quick_gelu`` pattern, ``scale_node`` the Mul
by alpha, in either order) is the same op with that alpha. The pattern binds the
Sigmoid's input as ``$x`` and leaves the Mul's other input free; this module checks
that it is the same value, so that a gate ``y * Sigmoid(x)`` (a squeeze-excitation
block) is reported, not fused.

What each target emits:

* ``onnxruntime``: ``com.microsoft.QuickGelu(x)`` with ``alpha = 1``, which computes
  ``x * sigmoid(alpha * x)``
  (https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md). It is
  what onnxruntime's own ENABLE_ALL optimizer makes of the pair (its QuickGeluFusion),
  so that level runs at the same speed; below it the pair costs two passes over memory
  (docs/benchmarks.md, section 8).
* ``generic``: ONNX has ``Swish(x, alpha)`` from opset 24
  (https://onnx.ai/onnx/operators/onnx__Swish.html), but onnxruntime 1.32 has no kernel
  for it: it runs the function body (``Mul(alpha, x)``, ``Sigmoid``, ``Mul``), which its
  optimizer does not fuse, and measured slower than the ``Sigmoid + Mul`` it replaces.
  So nothing fuses by default; a pattern with the param ``swish: true`` emits ``Swish``
  at opset >= 24 for a runtime that implements it.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
    scale_factor,
)
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["SWISH_OPSET", "FuseSiLU", "gated_input", "other_operand"]

# ONNX Swish exists from opset 24 on.
SWISH_OPSET = 24


class SiLUParams(Params):
    sigmoid_node: str = "sig"
    output_node: str = "out"  # the Mul
    # generic: emit ONNX Swish (opset >= 24) instead of leaving the pair as it is.
    swish: bool = False
    # x * Sigmoid(alpha * x): the Mul by the constant alpha before the Sigmoid.
    scale_node: str | None = None


def other_operand(match: Match, mul_node: str, inner: ir.Value, x: ir.Value | None) -> str | None:
    """Why the Mul ``mul_node`` does not multiply ``inner`` (a value of the match) by ``x``,
    or None."""
    mul = match.node(mul_node)
    others = [v for v in mul.inputs if v is not inner]
    if len(others) == 1 and others[0] is x and x is not None:
        return None
    other = others[0] if len(others) == 1 else inner
    x_name = x.name if x is not None else None
    other_name = other.name if other is not None else None
    return (
        f"{mul_node} (Mul -> {mul.outputs[0].name!r}) multiplies {inner.name!r} by "
        f"{other_name!r}, not by the activation's input {x_name!r}"
    )


def gated_input(match: Match, gate_node: str, output_node: str, what: str) -> ir.Value | str:
    """``x`` of ``x * gate(x)`` (SiLU, HardSwish): the gate's input, when the output Mul
    multiplies the gate by that very value; else why not, naming ``what`` it is not."""
    gate = match.node(gate_node)
    x = gate.inputs[0] if gate.inputs else None
    reason = other_operand(match, output_node, gate.outputs[0], x)
    if reason is not None or x is None:
        return f"not a {what}: {reason}"
    return x


class FuseSiLU(Rewriter):
    name = "silu"
    Params = SiLUParams

    def rewrite(self, match: Match, params: SiLUParams, ctx: RewriteContext) -> Rewrite | str:
        if params.scale_node is not None:
            found = _scaled_input(match, params)
        else:
            found = gated_input(match, params.sigmoid_node, params.output_node, "SiLU"), 1.0
        x, alpha = found
        if isinstance(x, str):
            return x
        if ctx.target.can_emit(MS_DOMAIN):
            ctx.use_domain(MS_DOMAIN)
            node = ir.Node(MS_DOMAIN, "QuickGelu", [x], [ir.AttrFloat32("alpha", alpha)])
        elif not params.swish:
            return (
                "generic: onnxruntime runs ONNX Swish (opset 24) as Mul, Sigmoid, Mul, slower "
                "than Sigmoid + Mul (docs/benchmarks.md, section 8); the pattern param "
                "swish: true emits it"
            )
        elif ctx.opset < SWISH_OPSET:
            return opset_refusal("ONNX Swish", SWISH_OPSET, ctx)
        else:
            node = ir.Node("", "Swish", [x], [ir.AttrFloat32("alpha", alpha)])
        out = match.node(params.output_node)
        return Rewrite([node], [(out.outputs[0], node.outputs[0])])


def _scaled_input(match: Match, params: SiLUParams) -> tuple[ir.Value | str, float]:
    """``x`` and ``alpha`` of ``x * Sigmoid(alpha * x)``, or why it is not one."""
    scale = match.node(params.scale_node or "scale")
    alpha = scale_factor(
        scale, next((v for v in scale.inputs if constant_array(v) is not None), None)
    )
    if isinstance(alpha, str):
        return f"not x * Sigmoid(alpha * x): {alpha}", 0.0
    x = next((v for v in scale.inputs if constant_array(v) is None), None)
    reason = other_operand(match, params.output_node, match.node(params.sigmoid_node).outputs[0], x)
    if reason is not None or x is None:
        return f"not x * Sigmoid(alpha * x): {reason}", 0.0
    return x, alpha
