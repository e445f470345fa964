"""``gelu``: the GELU activation written out as elementwise ops becomes one op.

The two forms (https://onnx.ai/onnx/operators/onnx__Gelu.html)::

    erf:   GELU(x) = 0.5 * x * (1 + erf(x / sqrt(2)))
    tanh:  GELU(x) ~ 0.5 * x * (1 + tanh(sqrt(2 / pi) * (x + 0.044715 * x^3)))

Exporters write the product ``0.5 * x * (1 + ...)`` in any of its pairings, ``x /
sqrt(2)`` as ``Div(x, sqrt(2))`` or ``Mul(x, 1 / sqrt(2))``, ``x^3`` as ``Pow(x, 3)``
or products, BLOOM the tanh argument as ``c x (1 + k x x)``: the canonical form's
``gelu_spelling`` rule writes each in one spelling per form, which one pattern matches
(``patterns/builtin/gelu_erf.yaml``, ``gelu_tanh.yaml``), whose constraints check the
constants. The one check left to this module is the erf scale, whose expected value
depends on the op matched (a Div by ``sqrt(2)`` or a Mul by ``1 / sqrt(2)``); it allows
a relative error of ``1e-5`` so that constants rounded to float32 or written with fewer
digits pass.

A preceding Add of a constant bias ``B`` of shape ``[hidden]`` (the bias of a Linear
layer: ``MatMul + Add + GELU``; the MatMul stays) fuses too: ``GELU(A + B)``.

What each target emits:

* ``generic``: ``Gelu(x)`` with ``approximate = "tanh"`` for the tanh form (ONNX opset 20
  and later; below that nothing fuses). A bias Add stays in front of it.
* ``onnxruntime``: the ``com.microsoft`` contrib ops
  (https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md):
  ``Gelu(X)`` and ``BiasGelu(A, B) = Gelu(A + B)`` for the erf form; for the tanh form
  ``FastGelu(X, bias)``, which computes
  ``0.5 * (X + bias) * (1 + tanh(0.797885 * (X + bias) + 0.035677 * (X + bias)^3))``
  (``0.035677 = 0.044715 * sqrt(2 / pi)``), the bias being optional.
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, PatternSpec, parse_ref
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    opset_refusal,
)
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["ERF_SCALE_RTOL", "FuseGelu"]

# ONNX Gelu exists from opset 20 on.
GELU_OPSET = 20
# Relative tolerance of the erf scale: sqrt(2) rounded to float32 is off by 1.7e-8, a
# hand-written 1.41421 by 2.5e-6.
ERF_SCALE_RTOL = 1e-5
_SQRT2 = math.sqrt(2.0)


class GeluParams(Params):
    approximate: Literal["none", "tanh"] = "none"
    # The value GELU is applied to (a value reference) when there is no bias Add.
    input: str = "$x"
    # The Add of a constant bias in front of the GELU: its input 1 (after the
    # commutative swap) is the bias, its input 0 the data.
    bias_node: str | None = None
    # erf form: the Div by sqrt(2) or Mul by 1 / sqrt(2) in front of Erf.
    scale_node: str | None = None
    output_node: str = "out"


class FuseGelu(Rewriter):
    name = "gelu"
    Params = GeluParams

    def validate_params(self, raw: dict, pattern: PatternSpec) -> GeluParams:
        params = super().validate_params(raw, pattern)
        if params.bias_node is None:
            try:
                ref = parse_ref(params.input)
            except ValueError as exc:
                raise ValueError(f"rewriter.params.input: {exc}") from None
            if ref.kind == "free":
                known = ref.name in pattern.free_inputs()
            else:
                known = ref.node in {n.id for n in pattern.nodes}
            if not known:
                raise ValueError(
                    f"rewriter.params.input: {params.input!r} is not a value of the pattern"
                )
        return params

    def rewrite(self, match: Match, params: GeluParams, ctx: RewriteContext) -> Rewrite | str:
        if params.scale_node is not None:
            reason = erf_scale_reason(match, params.scale_node)
            if reason is not None:
                return reason
        data, bias = match.value(params.input), None
        if params.bias_node is not None:
            data, bias = match.input(params.bias_node, 0), match.input(params.bias_node, 1)
            reason = bias_reason(data, bias)
            if reason is not None:
                return reason
        if data is None:
            return f"the GELU input {params.input} is absent"
        if ctx.target.can_emit(MS_DOMAIN):
            node = _contrib_node(params.approximate, data, bias)
            ctx.use_domain(MS_DOMAIN)
        else:
            if bias is not None:
                return "standard ONNX has no Gelu with a bias input (onnxruntime only)"
            if ctx.opset < GELU_OPSET:
                return opset_refusal("ONNX Gelu", GELU_OPSET, ctx)
            attrs = [ir.AttrString("approximate", "tanh")] if params.approximate == "tanh" else []
            node = ir.Node("", "Gelu", [data], attrs)
        out = match.node(params.output_node)
        return Rewrite([node], [(out.outputs[0], node.outputs[0])])


def _contrib_node(approximate: str, data: ir.Value, bias: ir.Value | None) -> ir.Node:
    if approximate == "tanh":
        return ir.Node(MS_DOMAIN, "FastGelu", [data] if bias is None else [data, bias])
    if bias is None:
        return ir.Node(MS_DOMAIN, "Gelu", [data])
    return ir.Node(MS_DOMAIN, "BiasGelu", [data, bias])


def erf_scale_reason(match: Match, scale_node: str) -> str | None:
    """Why ``scale_node`` is not ``x / sqrt(2)`` (a Div by sqrt(2) or a Mul by its
    inverse, each element within ``ERF_SCALE_RTOL``), or None."""
    node, value = match.node(scale_node), match.input(scale_node, 1)
    label = (
        f"{scale_node}.in1 ({value.name!r}) of {node.op_type}" if value is not None else scale_node
    )
    array = constant_array(value)
    if array is None:
        return f"{label} is not a constant"
    if node.op_type == "Div":
        expected, name = _SQRT2, "sqrt(2)"
    else:
        expected, name = 1.0 / _SQRT2, "1/sqrt(2)"
    if np.allclose(array.astype(np.float64), expected, rtol=ERF_SCALE_RTOL, atol=0.0):
        return None
    return (
        f"{label} is {array.reshape(-1)[:4].tolist()}, expected {name} = {expected:.8g} "
        f"(relative tolerance {ERF_SCALE_RTOL:g})"
    )


def bias_reason(data: ir.Value | None, bias: ir.Value | None) -> str | None:
    """Why ``bias`` is not one bias value per element of ``data``'s last axis, or None.

    BiasGelu and FastGelu take a 1-D bias of shape ``[hidden]``; the pattern's
    constraints make it a constant of rank 1 that does not grow ``data``, which still
    leaves a bias of shape ``[1]``.
    """
    array = constant_array(bias)
    if data is None or array is None:
        return "the bias Add has no constant bias input"
    hidden = data.shape[-1] if data.shape is not None and len(data.shape) > 0 else None
    if array.ndim != 1 or not isinstance(hidden, int) or array.shape[0] != hidden:
        return (
            f"the bias {bias.name!r} has shape {list(array.shape)} but the data "
            f"{data.name!r} has shape {data.shape}: the fused op needs a bias of shape [hidden]"
        )
    return None
