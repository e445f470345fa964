"""``skip_layer_norm`` (onnxruntime only): a residual Add before a LayerNormalization
(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.SkipLayerNormalization)::

    s = input + skip [+ bias]
    y = LayerNormalization(s, gamma, beta, axis=-1, epsilon=eps)
      = SkipLayerNormalization(input, skip, gamma, beta, bias, epsilon=eps)   -> (y, _, _, s)

Its fourth output ``input_skip_bias_sum`` is ``s``: where ``s`` also feeds the next
residual Add (pre-LN transformers), that Add reads it. In a pre-LN chain the next Add is
the residual Add of the next block, so every other block fuses in one round; in the next
round the other reader of ``s`` is that block's SkipLayerNormalization, which then reads
``s`` from the new node instead. onnxruntime's CPU kernel takes
an input of rank 2 or 3 and broadcasts only ``skip`` (``[1, S, H]`` or ``[S, H]``); a
broadcast ``input`` gives wrong results without an error, so the full-shape operand
becomes ``input``.

Only float32 is fused. fp16 models often wrap the written-out form in Casts to float32;
those Casts are not part of the patterns.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    copy_attributes,
)
from autofusion.fusion_core.rewriters._effect import RewriteEffect, matched, present
from autofusion.fusion_core.rewriters._norm import hidden_size, normalizes_last_axis
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["SkipLayerNorm", "input_and_skip", "pre_ln_effect", "skip_rewrite", "unname_unused"]


class SkipLayerNormParams(Params):
    add_node: str = "add"  # the residual Add feeding the LayerNormalization
    layer_norm_node: str = "ln"
    bias_add_node: str | None = None  # Add(x, constant bias) feeding the residual Add
    # The other reader of the sum (the next residual Add, or the SkipLayerNormalization
    # it became); it is re-created reading input_skip_bias_sum.
    next_node: str | None = None
    # The sum is read outside the match (the pattern ``exposes`` it: GPT-NeoX's parallel
    # residual, whose sum feeds two LayerNorms and the next residual Add): its readers
    # read input_skip_bias_sum instead.
    expose_sum: bool = False


class SkipLayerNorm(Rewriter):
    name = "skip_layer_norm"
    targets = frozenset({"onnxruntime"})
    Params = SkipLayerNormParams

    def cost_effect(self, match: Match, params: SkipLayerNormParams) -> RewriteEffect:
        return pre_ln_effect(match, params.next_node)

    def rewrite(
        self, match: Match, params: SkipLayerNormParams, ctx: RewriteContext
    ) -> Rewrite | str:
        ln, add = match.node(params.layer_norm_node), match.node(params.add_node)
        failure = normalizes_last_axis(ln)
        if failure is not None:
            return failure
        operands = _operands(match, params)
        if isinstance(operands, str):
            return operands
        first, second, bias = operands
        pair = input_and_skip(first, second, add)
        if isinstance(pair, str):
            return pair
        ctx.use_domain(MS_DOMAIN)
        with_sum = params.next_node is not None or params.expose_sum
        node = _skip_layer_norm(ln, [*pair, bias], with_sum=with_sum)
        rewrite = skip_rewrite(match, node, ln, add, params.next_node)
        if params.expose_sum and params.next_node is None:
            rewrite.replaced.append((add.outputs[0], node.outputs[3]))
        return rewrite


def pre_ln_effect(match: Match, next_node: str | None) -> RewriteEffect:
    """What a skip norm's match fuses: the pre-LN forms match the next residual Add only
    so that the sum may escape; it is re-created as it was (not fused)."""
    kept = present(match, next_node)
    return RewriteEffect(tuple(n for n in matched(match) if n not in kept))


def skip_rewrite(
    match: Match, node: ir.Node, norm: ir.Node, add: ir.Node, next_node: str | None
) -> Rewrite:
    """``node`` (a skip norm) replaces ``norm``; with ``next_node``, the other reader of
    the sum is re-created reading input_skip_bias_sum (output 3), where the sum lives on."""
    replaced = [(norm.outputs[0], node.outputs[0])]
    if next_node is None:
        return Rewrite([node], replaced)
    following = match.node(next_node)
    clone = clone_node(following)
    replaced.append((add.outputs[0], node.outputs[3]))
    replaced += list(zip(following.outputs, clone.outputs, strict=True))
    return Rewrite([node, clone], replaced)


def _skip_layer_norm(ln: ir.Node, summed: list[ir.Value | None], *, with_sum: bool) -> ir.Node:
    """SkipLayerNormalization(input, skip, gamma, beta, bias) with ``ln``'s epsilon;
    ``with_sum``: it also produces input_skip_bias_sum (output 3)."""
    inputs = [summed[0], summed[1], ln.inputs[1], ln.inputs[2] if len(ln.inputs) > 2 else None]
    inputs.append(summed[2])
    while inputs[-1] is None:
        inputs.pop()
    eps = float(attribute_value(ln, "epsilon", 1e-5))
    node = ir.Node(
        MS_DOMAIN,
        "SkipLayerNormalization",
        inputs,
        [ir.AttrFloat32("epsilon", eps)],
        num_outputs=4 if with_sum else 1,
    )
    unname_unused(node)
    return node


def unname_unused(node: ir.Node) -> None:
    """Outputs 1 and 2 of the skip norms (mean, inv_std_var) are not produced."""
    for unused in node.outputs[1:3]:
        unused.name = ""


def clone_node(node: ir.Node) -> ir.Node:
    """A copy of ``node`` reading the same values (its unnamed outputs stay unnamed)."""
    clone = ir.Node(
        node.domain,
        node.op_type,
        list(node.inputs),
        copy_attributes(node),
        num_outputs=len(node.outputs),
        name=node.name,
    )
    for old, new in zip(node.outputs, clone.outputs, strict=True):
        if old.name == "":
            new.name = ""
    return clone


def _operands(
    match: Match, params: SkipLayerNormParams
) -> tuple[ir.Value, ir.Value, ir.Value | None] | str:
    """The two summed tensors and the bias (None without a bias Add)."""
    add = params.add_node
    if params.bias_add_node is None:
        first, second, bias = match.input(add, 0), match.input(add, 1), None
    else:
        bias_add = params.bias_add_node
        first, second = match.input(bias_add, 0), match.input(add, 1)
        bias = match.input(bias_add, 1)
        size = _bias_size(bias)
        if first is None or size is None or size != hidden_size(first):
            return f"the bias of Add {match.node(bias_add).name!r} is not one value per feature"
    if first is None or second is None:
        return f"Add {match.node(add).name!r} has a missing input"
    return first, second, bias


def _bias_size(value: ir.Value | None) -> int | None:
    array = constant_array(value)
    return array.size if array is not None and array.ndim == 1 else None


def _dims(value: ir.Value) -> list[int | str] | None:
    """The dimensions as numbers or symbol names; None if any is unknown."""
    if value.shape is None:
        return None
    dims: list[int | str] = []
    for dim in value.shape:
        if isinstance(dim, int):
            dims.append(dim)
        elif dim.value is not None:
            dims.append(dim.value)
        else:
            return None
    return dims


def input_and_skip(a: ir.Value, b: ir.Value, add: ir.Node) -> tuple[ir.Value, ir.Value] | str:
    """(input, skip): the full-shape operand is the input; skip is equal or [1, S, H], [S, H]."""
    dims_a, dims_b = _dims(a), _dims(b)
    if dims_a is None or dims_b is None:
        return f"the shapes added by Add {add.name!r} are not fully known"
    if dims_a == dims_b:
        return a, b
    for (full, dims), (skip, small) in (((a, dims_a), (b, dims_b)), ((b, dims_b), (a, dims_a))):
        if len(dims) == 3 and small in (dims[1:], [1, *dims[1:]]):
            return full, skip
    return (
        f"Add {add.name!r} adds shapes {dims_a} and {dims_b}: SkipLayerNormalization "
        "broadcasts only a skip of shape [1, S, H] or [S, H]"
    )
