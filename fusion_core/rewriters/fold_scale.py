"""``fold_scale``: a constant scalar scale moved into the weights of the projection it
scales, across the linear ops in between::

    y = Mul(f(Add(MatMul(x, W), b)), c)        f: Reshape, Transpose, MatMul(., K^T), ...
      = f(Add(MatMul(x, W * c), b * c))

This is exact up to rounding because every op on the path is linear in the operand the
path goes through: Reshape and Transpose move elements, a MatMul by another tensor is
linear in each argument, and ``(x W + b) c = x (W c) + b c``. A ``Div`` by ``c`` folds
``1 / c``. It is how the attention scale (``Q @ K^T / sqrt(head_size)``, or SDPA's
``head_size^-1/4`` on Q and on K^T each) disappears on targets without a fused
attention op; the built-in patterns say which paths and which constants.

The matched nodes between the projection and the scale are copied in pattern order with
the scaled weight and bias, and the scale's output is replaced by the copy of its
input; the original weight stays for any other reader.
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
    scale_factor,
)
from autofusion.fusion_core.rewriters._effect import RewriteEffect, present, producers

__all__ = ["FoldScale"]


class FoldScaleParams(Params):
    matmul_node: str = "proj"  # MatMul(x, W), W constant
    bias_node: str | None = "bias"  # Add(MatMul, b), b constant
    scale_node: str = "scale"  # Mul(path, c) or Div(path, c), c a constant scalar


class FoldScale(Rewriter):
    name = "fold_scale"
    Params = FoldScaleParams

    def cost_effect(self, match: Match, params: FoldScaleParams) -> RewriteEffect:
        # The scale folds into the projection's weights: the scale node and the node
        # feeding it become one kernel; the rest of the match stays as it was.
        scale = params.scale_node
        return RewriteEffect(present(match, *producers(match, scale), scale), (scale,))

    def rewrite(self, match: Match, params: FoldScaleParams, ctx: RewriteContext) -> Rewrite | str:
        scale = match.node(params.scale_node)
        c = scale_factor(scale, match.input(params.scale_node, 1))
        if isinstance(c, str):
            return c
        swapped: dict[int, ir.Value] = {}
        matmul = match.node(params.matmul_node)
        weight = constant_array(matmul.inputs[1])
        if weight is None:
            return f"the weight of MatMul {matmul.name!r} is not a constant"
        swapped[id(matmul.inputs[1])] = ctx.initializer(
            f"{matmul.inputs[1].name}_scaled", (weight * c).astype(weight.dtype)
        )
        if params.bias_node is not None:
            bias_value = match.input(params.bias_node, 1)
            bias = constant_array(bias_value)
            if bias is None or bias_value is None:
                return f"the bias of {params.bias_node!r} is not a constant"
            swapped[id(bias_value)] = ctx.initializer(
                f"{bias_value.name}_scaled", (bias * c).astype(bias.dtype)
            )
        nodes = []
        for node in _in_order([n for i, n in match.nodes.items() if i != params.scale_node]):
            inputs = [swapped.get(id(v), v) if v is not None else None for v in node.inputs]
            copy = ir.Node(
                node.domain,
                node.op_type,
                inputs,
                node.attributes.values(),
                num_outputs=len(node.outputs),
            )
            for old, new in zip(node.outputs, copy.outputs, strict=True):
                new.type, new.shape = old.type, old.shape
                swapped[id(old)] = new
            nodes.append(copy)
        path_end = match.input(params.scale_node, 0)
        if path_end is None or id(path_end) not in swapped:
            return f"{scale.op_type} {scale.name!r} does not scale the matched path"
        return Rewrite(nodes, [(scale.outputs[0], swapped[id(path_end)])])


def _in_order(nodes: list[ir.Node]) -> list[ir.Node]:
    """The nodes with every producer before its readers (patterns may list them freely)."""
    members = {id(n) for n in nodes}
    done: set[int] = set()
    ordered: list[ir.Node] = []
    while len(ordered) < len(nodes):
        for node in nodes:
            if id(node) in done:
                continue
            producers = [v.producer() for v in node.inputs if v is not None]
            if all(p is None or id(p) not in members or id(p) in done for p in producers):
                done.add(id(node))
                ordered.append(node)
    return ordered
