"""``fuse_activation``: Conv [+ BatchNormalization] [+ residual Add] + activation, or
Gemm + activation, into one kernel.

On ``onnxruntime`` this emits the contrib ops
(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md):

* ``com.microsoft.FusedConv(X, W, B, Z)``: ``Y = act(Conv(X, W, B) + Z)`` where ``Z`` is
  the residual (optional), ``activation`` names the op and ``activation_params`` its
  parameters (LeakyRelu ``[alpha]``, Clip ``[min, max]``, HardSigmoid ``[alpha, beta]``);
* ``com.microsoft.FusedGemm(A, B, C)``: ``Y = act(alpha * A'B' + beta * C)`` with
  ``activation_alpha`` / ``activation_beta``.

A BatchNormalization between Conv and activation is folded first
(``W' = W * s``, ``b' = (b - mean) * s + beta``, see ``_affine``). Standard ONNX has no
fused Conv+activation op, so on ``generic`` only that folding happens and the
activation (and residual Add) stay.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._affine import batchnorm_scale_shift, fold_into_producer
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    copy_attributes,
)
from autofusion.fusion_core.rewriters._effect import RewriteEffect, matched, present
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["FuseActivation", "activation_params", "clip_bounds"]

CONV_ACTIVATIONS = ("Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "Tanh")
GEMM_ACTIVATIONS = ("Relu", "LeakyRelu", "Sigmoid", "HardSigmoid", "Tanh")


class FuseActivationParams(Params):
    producer_node: str = "conv"
    batchnorm_node: str | None = None
    add_node: str | None = None
    activation_node: str = "act"


def activation_params(act: ir.Node) -> list[float] | str:
    """The parameters of an activation in the order FusedConv expects, or why not."""
    op = act.op_type
    if op == "LeakyRelu":
        return [float(attribute_value(act, "alpha"))]
    if op == "HardSigmoid":
        return [float(attribute_value(act, "alpha")), float(attribute_value(act, "beta"))]
    if op == "Clip":
        return clip_bounds(act)
    return []


def clip_bounds(clip: ir.Node) -> list[float] | str:
    """A Clip's [min, max] (inputs from opset 11, attributes before; absent: unbounded)."""
    info = np.finfo(np.float32)
    if clip.attributes.get("min") is not None or clip.attributes.get("max") is not None:
        # opset < 11: bounds are attributes; an absent one is unbounded
        low, high = attribute_value(clip, "min"), attribute_value(clip, "max")
        return [
            float(info.min) if low is None else float(low),
            float(info.max) if high is None else float(high),
        ]
    bounds = []
    for index, default in ((1, float(info.min)), (2, float(info.max))):
        value = clip.inputs[index] if index < len(clip.inputs) else None
        if value is None:
            bounds.append(default)
            continue
        array = constant_array(value)
        if array is None:
            return f"the bound {value.name!r} of Clip {clip.name!r} is not a constant"
        bounds.append(float(array.reshape(-1)[0]))
    return bounds


class FuseActivation(Rewriter):
    name = "fuse_activation"
    Params = FuseActivationParams

    def cost_effect(self, match: Match, params: FuseActivationParams) -> RewriteEffect:
        # a BatchNormalization in the match folds into the producer's weights
        return RewriteEffect(matched(match), present(match, params.batchnorm_node))

    def rewrite(
        self, match: Match, params: FuseActivationParams, ctx: RewriteContext
    ) -> Rewrite | str:
        producer = match.node(params.producer_node)
        act = match.node(params.activation_node)
        if ctx.target.can_emit(MS_DOMAIN):
            return self._fused(match, params, producer, act, ctx)
        if params.batchnorm_node is None:
            return "generic ONNX has no fused Conv/Gemm + activation op"
        return self._fold_only(match, params, producer, ctx)

    def _fold_only(
        self, match: Match, params: FuseActivationParams, producer: ir.Node, ctx: RewriteContext
    ) -> Rewrite | str:
        bn = match.node(params.batchnorm_node)
        affine = batchnorm_scale_shift(bn)
        if isinstance(affine, str):
            return affine
        folded = fold_into_producer(producer, *affine, ctx)
        if isinstance(folded, str):
            return folded
        # Keep the rest of the chain: re-create it on top of the folded producer.
        rest = [match.node(n) for n in (params.add_node, params.activation_node) if n is not None]
        conv = folded.build()
        new_nodes, previous, current = [conv], bn.outputs[0], conv.outputs[0]
        for node in rest:
            inputs = [current if v is previous else v for v in node.inputs]
            clone = ir.Node(
                node.domain, node.op_type, inputs, copy_attributes(node), name=node.name
            )
            new_nodes.append(clone)
            previous, current = node.outputs[0], clone.outputs[0]
        return Rewrite(new_nodes, [(previous, current)])

    def _fused(
        self,
        match: Match,
        params: FuseActivationParams,
        producer: ir.Node,
        act: ir.Node,
        ctx: RewriteContext,
    ) -> Rewrite | str:
        allowed = CONV_ACTIVATIONS if producer.op_type == "Conv" else GEMM_ACTIVATIONS
        if producer.op_type not in ("Conv", "Gemm") or act.op_type not in allowed:
            return f"onnxruntime has no fused kernel for {producer.op_type} + {act.op_type}"
        act_params = activation_params(act)
        if isinstance(act_params, str):
            return act_params
        residual = self._residual(match, params)
        if isinstance(residual, str):
            return residual
        inputs, attributes = list(producer.inputs), copy_attributes(producer)
        if params.batchnorm_node is not None:
            affine = batchnorm_scale_shift(match.node(params.batchnorm_node))
            if isinstance(affine, str):
                return affine
            folded = fold_into_producer(producer, *affine, ctx)
            if isinstance(folded, str):
                return folded
            inputs, attributes = list(folded.inputs), folded.attributes
        ctx.use_domain(MS_DOMAIN)
        if producer.op_type == "Gemm":
            attributes += _gemm_activation_attrs(act.op_type, act_params)
            op_type = "FusedGemm"
        else:
            if residual is not None:
                inputs = (inputs + [None] * 3)[:3] + [residual]
            attributes += [ir.AttrString("activation", act.op_type)]
            if act_params:
                attributes.append(ir.AttrFloat32s("activation_params", act_params))
            op_type = "FusedConv"
        while inputs and inputs[-1] is None:
            inputs.pop()
        fused = ir.Node(MS_DOMAIN, op_type, inputs, attributes, name=producer.name)
        return Rewrite([fused], [(act.outputs[0], fused.outputs[0])])

    @staticmethod
    def _residual(match: Match, params: FuseActivationParams) -> ir.Value | None | str:
        if params.add_node is None:
            return None
        add = match.node(params.add_node)
        inner = {id(v) for n in match.nodes.values() for v in n.outputs}
        others = [v for v in add.inputs if id(v) not in inner]
        if len(others) != 1:
            return f"Add {add.name!r} has no single residual input"
        return others[0]


def _gemm_activation_attrs(op_type: str, act_params: list[float]) -> list[ir.Attr]:
    attrs: list[ir.Attr] = [ir.AttrString("activation", op_type)]
    for name, value in zip(("activation_alpha", "activation_beta"), act_params, strict=False):
        attrs.append(ir.AttrFloat32(name, value))
    return attrs
