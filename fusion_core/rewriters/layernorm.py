"""Normalizations written out as elementwise ops, fused into one normalization op.

``layer_norm``: layer normalization over the last axis
(https://onnx.ai/onnx/operators/onnx__LayerNormalization.html)::

    mean = ReduceMean(x, axes=[-1], keepdims=1)
    d    = x - mean
    var  = ReduceMean(Pow(d, 2))  or  ReduceMean(d * d)
    y    = d / Sqrt(var + eps)    or  d * Reciprocal(Sqrt(var + eps))
         = LayerNormalization(x, Scale=1, axis=-1, epsilon=eps)

LayerNormalization is standard ONNX from opset 17. onnxruntime also registers its own
LayerNormalization in the ONNX domain from version 1, so on the ``onnxruntime`` target a
model below opset 17 gets it too: such a model runs in onnxruntime, but ``onnx.checker``
rejects it ("No Op registered for LayerNormalization with domain_version of 13").

``fold_layer_norm_affine``: a constant per-feature Mul or Add after a LayerNormalization
folds into its Scale and B, so the scale and bias of a written-out layer norm join it in
the rounds after ``layer_norm``::

    LN(x, s, b) * g = LN(x, s * g, b * g)          LN(x, s, b) + c = LN(x, s, b + c)

``rms_norm``: RMS normalization over the last axis
(https://onnx.ai/onnx/operators/onnx__RMSNormalization.html)::

    r = Sqrt(ReduceMean(Pow(x, 2), axes=[-1]) + eps)
    y = x / r * gamma  or  x * Reciprocal(r) * gamma  or  x * (1 / r) * gamma
      = RMSNormalization(x, gamma, axis=-1, epsilon=eps)                 (opset >= 23)
      = SimplifiedLayerNormalization(x, gamma, axis=-1, epsilon=eps)     (onnxruntime)

SimplifiedLayerNormalization is onnxruntime's own op, registered in the ONNX domain (not
``com.microsoft``); ``onnx.checker`` rejects it at every opset. Without ``gamma``
the scale is 1.

``skip_layer_norm`` (onnxruntime only): a residual Add before a LayerNormalization
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

import numpy as np
import onnx_ir as ir

from fusion_core.ir import constant_array
from fusion_core.patterns import Match, attribute_value
from fusion_core.rewriters._affine import per_channel
from fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter, copy_attributes
from fusion_core.rewriters._effect import RewriteEffect, matched, present
from fusion_core.targets import MS_DOMAIN

__all__ = ["FoldLayerNormAffine", "LayerNorm", "RMSNorm", "SkipLayerNorm"]

LAYER_NORM_OPSET = 17
RMS_NORM_OPSET = 23


def _runs_onnxruntime(ctx: RewriteContext) -> bool:
    # onnxruntime's own ONNX-domain kernels (LayerNormalization below opset 17,
    # SimplifiedLayerNormalization) come with the target that may emit its contrib ops.
    return ctx.target.can_emit(MS_DOMAIN)


def _reduction_axes(node: ir.Node) -> list[int] | None | str:
    """The axes a ReduceMean reduces: the attribute (opset < 18) or the constant input 1
    (opset >= 18); None when there are none, which means every axis."""
    attr = node.attributes.get("axes")
    if attr is not None:
        return [int(a) for a in attr.value]
    value = node.inputs[1] if len(node.inputs) > 1 else None
    if value is None:
        return None
    array = constant_array(value)
    if array is None:
        return f"the axes of ReduceMean {node.name!r} are not a constant"
    return [int(a) for a in array.reshape(-1)] or None


def _rank(value: ir.Value) -> int | None:
    return len(value.shape) if value.shape is not None else None


def _reduces_last_axis(node: ir.Node, rank: int | None) -> str | None:
    """None if the ReduceMean reduces exactly the last axis of its rank-``rank`` input."""
    axes = _reduction_axes(node)
    if isinstance(axes, str):
        return axes
    if axes == [-1]:
        return None
    if rank is None:
        return f"the rank of the input of ReduceMean {node.name!r} is unknown"
    reduced = sorted({a % rank for a in axes}) if axes is not None else list(range(rank))
    if reduced != [rank - 1]:
        shown = "all axes" if axes is None else f"axes {axes}"
        return (
            f"ReduceMean {node.name!r} reduces {shown} of a rank-{rank} input, "
            "not only the last axis"
        )
    return None


def _normalizes_last_axis(node: ir.Node) -> str | None:
    axis = int(attribute_value(node, "axis", -1))
    rank = _rank(node.inputs[0])
    if axis == -1 or (rank is not None and axis == rank - 1):
        return None
    return f"{node.op_type} {node.name!r} normalizes from axis {axis}, not over the last axis"


def _hidden_size(x: ir.Value) -> int | str:
    dim = x.shape[-1] if x.shape is not None and len(x.shape) else None
    if not isinstance(dim, int):
        return f"the last dimension of {x.name!r} is not known"
    return dim


def _epsilon(match: Match, eps_node: str) -> float | str:
    """The scalar added to the variance (input 1 of the pattern's Add node)."""
    value = match.input(eps_node, 1)
    array = constant_array(value)
    if array is None or array.size != 1:
        name = value.name if value is not None else "?"
        return f"epsilon {name!r} of Add {match.node(eps_node).name!r} is not a constant scalar"
    return float(array.reshape(-1)[0])


def _statistics(
    match: Match, x: ir.Value, reductions: list[ir.Node], eps_node: str
) -> tuple[int, float] | str:
    """(hidden size, epsilon) of a written-out normalization of ``x``, or why not."""
    rank = _rank(x)
    for node in reductions:
        failure = _reduces_last_axis(node, rank)
        if failure is not None:
            return failure
    hidden = _hidden_size(x)
    if isinstance(hidden, str):
        return hidden
    eps = _epsilon(match, eps_node)
    if isinstance(eps, str):
        return eps
    return hidden, eps


def _dtype(value: ir.Value) -> np.dtype:
    return value.dtype.numpy() if value.dtype is not None else np.dtype(np.float32)


def _norm_attributes(eps: float) -> list[ir.Attr]:
    return [ir.AttrInt64("axis", -1), ir.AttrFloat32("epsilon", eps)]


class LayerNormParams(Params):
    mean_node: str = "mean"  # ReduceMean(x)
    variance_node: str = "var"  # ReduceMean of the squared difference
    epsilon_node: str = "eps"  # Add(var, eps)
    output_node: str = "norm"  # the normalized value


class LayerNorm(Rewriter):
    name = "layer_norm"
    Params = LayerNormParams

    def rewrite(self, match: Match, params: LayerNormParams, ctx: RewriteContext) -> Rewrite | str:
        if ctx.opset < LAYER_NORM_OPSET and not _runs_onnxruntime(ctx):
            return f"LayerNormalization needs opset {LAYER_NORM_OPSET} (the model has {ctx.opset})"
        mean = match.node(params.mean_node)
        x = mean.inputs[0]
        reductions = [mean, match.node(params.variance_node)]
        stats = _statistics(match, x, reductions, params.epsilon_node)
        if isinstance(stats, str):
            return stats
        hidden, eps = stats
        scale = ctx.initializer(f"{x.name or 'x'}_ln_scale", np.ones(hidden, _dtype(x)))
        node = ir.Node("", "LayerNormalization", [x, scale], _norm_attributes(eps))
        return Rewrite([node], [(match.node(params.output_node).outputs[0], node.outputs[0])])


class RMSNormParams(Params):
    square_node: str = "sq"  # Pow(x, 2)
    variance_node: str = "var"  # ReduceMean of the squares
    epsilon_node: str = "eps"  # Add(var, eps)
    output_node: str = "norm"  # x / rms or x * (1 / rms)
    scale_node: str | None = None  # Mul(norm, gamma), if the pattern has one


class RMSNorm(Rewriter):
    name = "rms_norm"
    Params = RMSNormParams

    def rewrite(self, match: Match, params: RMSNormParams, ctx: RewriteContext) -> Rewrite | str:
        if ctx.opset >= RMS_NORM_OPSET:
            op_type = "RMSNormalization"
        elif _runs_onnxruntime(ctx):
            op_type = "SimplifiedLayerNormalization"
        else:
            return f"RMSNormalization needs opset {RMS_NORM_OPSET} (the model has {ctx.opset})"
        x = match.node(params.square_node).inputs[0]
        stats = _statistics(match, x, [match.node(params.variance_node)], params.epsilon_node)
        if isinstance(stats, str):
            return stats
        hidden, eps = stats
        gamma = self._gamma(match, params, hidden)
        if isinstance(gamma, str):
            return gamma
        scale = ctx.initializer(f"{x.name or 'x'}_rms_scale", gamma.astype(_dtype(x)))
        node = ir.Node("", op_type, [x, scale], _norm_attributes(eps))
        last = match.node(params.scale_node or params.output_node)
        return Rewrite([node], [(last.outputs[0], node.outputs[0])])

    @staticmethod
    def _gamma(match: Match, params: RMSNormParams, hidden: int) -> np.ndarray | str:
        if params.scale_node is None:
            return np.ones(hidden)
        value = match.input(params.scale_node, 1)
        array = constant_array(value)
        gamma = per_channel(array, hidden) if array is not None else None
        if gamma is None:
            name = value.name if value is not None else "?"
            return f"the scale {name!r} is not a constant with one value per feature ({hidden})"
        return gamma


class FoldLayerNormAffineParams(Params):
    layer_norm_node: str = "ln"
    affine_node: str = "op"  # Mul or Add with a constant input 1


class FoldLayerNormAffine(Rewriter):
    name = "fold_layer_norm_affine"
    Params = FoldLayerNormAffineParams

    def cost_effect(self, match: Match, params: FoldLayerNormAffineParams) -> RewriteEffect:
        # the Mul/Add folds into LayerNormalization's scale or bias: its FLOPs go
        return RewriteEffect(matched(match), present(match, params.affine_node))

    def rewrite(
        self, match: Match, params: FoldLayerNormAffineParams, ctx: RewriteContext
    ) -> Rewrite | str:
        ln, op = match.node(params.layer_norm_node), match.node(params.affine_node)
        failure = _normalizes_last_axis(ln)
        if failure is not None:
            return failure
        hidden = _hidden_size(ln.inputs[0])
        if isinstance(hidden, str):
            return hidden
        folded = _folded_scale_bias(ln, op, match.input(params.affine_node, 1), hidden)
        if isinstance(folded, str):
            return folded
        scale, bias = folded
        dtype = _dtype(ln.inputs[1])
        stem = ln.name or "layer_norm"
        inputs = [ln.inputs[0], ctx.initializer(f"{stem}_scale_folded", scale.astype(dtype))]
        if bias is not None:
            inputs.append(ctx.initializer(f"{stem}_bias_folded", bias.astype(dtype)))
        node = ir.Node(
            ln.domain,
            ln.op_type,
            inputs,
            copy_attributes(ln),
            num_outputs=len(ln.outputs),
            name=ln.name,
        )
        # Mean and InvStdDev do not depend on Scale and B: the new node provides them.
        replaced = [(op.outputs[0], node.outputs[0])]
        replaced += list(zip(ln.outputs[1:], node.outputs[1:], strict=True))
        return Rewrite([node], replaced)


def _folded_scale_bias(
    ln: ir.Node, op: ir.Node, const: ir.Value | None, hidden: int
) -> tuple[np.ndarray, np.ndarray | None] | str:
    """Scale and B (None: absent) of ``op(LN(x, Scale, B), const)`` as one LN."""
    arrays = {"Scale": ln.inputs[1], "B": ln.inputs[2] if len(ln.inputs) > 2 else None}
    per_feature: dict[str, np.ndarray | None] = {}
    for role, value in arrays.items():
        array = constant_array(value) if value is not None else None
        per_feature[role] = per_channel(array, hidden) if array is not None else None
        if value is not None and per_feature[role] is None:
            return f"{role} {value.name!r} of {ln.op_type} {ln.name!r} is not a constant [{hidden}]"
    array = constant_array(const)
    factor = per_channel(array, hidden) if array is not None else None
    if factor is None:
        name = const.name if const is not None else "?"
        return f"{op.op_type} {op.name!r}: {name!r} is not a constant with one value per feature"
    scale, bias = per_feature["Scale"], per_feature["B"]
    if op.op_type == "Mul":
        return scale * factor, None if bias is None else bias * factor
    return scale, factor if bias is None else bias + factor


class SkipLayerNormParams(Params):
    add_node: str = "add"  # the residual Add feeding the LayerNormalization
    layer_norm_node: str = "ln"
    bias_add_node: str | None = None  # Add(x, constant bias) feeding the residual Add
    # The other reader of the sum (the next residual Add, or the SkipLayerNormalization
    # it became); it is re-created reading input_skip_bias_sum.
    next_node: str | None = None


class SkipLayerNorm(Rewriter):
    name = "skip_layer_norm"
    targets = frozenset({"onnxruntime"})
    Params = SkipLayerNormParams

    def cost_effect(self, match: Match, params: SkipLayerNormParams) -> RewriteEffect:
        # The pre-LN forms match the next residual Add only so that the sum may escape:
        # it is re-created as it was (not fused), reading input_skip_bias_sum.
        kept = present(match, params.next_node)
        return RewriteEffect(tuple(n for n in matched(match) if n not in kept))

    def rewrite(
        self, match: Match, params: SkipLayerNormParams, ctx: RewriteContext
    ) -> Rewrite | str:
        ln, add = match.node(params.layer_norm_node), match.node(params.add_node)
        failure = _normalizes_last_axis(ln)
        if failure is not None:
            return failure
        operands = _operands(match, params)
        if isinstance(operands, str):
            return operands
        first, second, bias = operands
        pair = _input_and_skip(first, second, add)
        if isinstance(pair, str):
            return pair
        ctx.use_domain(MS_DOMAIN)
        node = _skip_layer_norm(ln, [*pair, bias], with_sum=params.next_node is not None)
        replaced = [(ln.outputs[0], node.outputs[0])]
        if params.next_node is None:
            return Rewrite([node], replaced)
        following = match.node(params.next_node)
        clone = _clone(following)
        # The sum lives on as input_skip_bias_sum; the clone reads it from there.
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
    for unused in node.outputs[1:3]:  # mean and inv_std_var are not produced
        unused.name = ""
    return node


def _clone(node: ir.Node) -> ir.Node:
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
        if first is None or size is None or size != _hidden_size(first):
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


def _input_and_skip(a: ir.Value, b: ir.Value, add: ir.Node) -> tuple[ir.Value, ir.Value] | str:
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
