"""``fold_layer_norm_affine``: a constant per-feature Mul or Add after a LayerNormalization
folds into its Scale and B, so the scale and bias of a written-out layer norm join it in
the rounds after ``layer_norm``::

    LN(x, s, b) * g = LN(x, s * g, b * g)          LN(x, s, b) + c = LN(x, s, b + c)

Only float32 is fused. fp16 models often wrap the written-out form in Casts to float32;
those Casts are not part of the patterns.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._affine import per_channel
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    copy_attributes,
)
from autofusion.fusion_core.rewriters._effect import RewriteEffect, matched, present
from autofusion.fusion_core.rewriters._norm import dtype_of, hidden_size, normalizes_last_axis

__all__ = ["FoldLayerNormAffine"]


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
        failure = normalizes_last_axis(ln)
        if failure is not None:
            return failure
        hidden = hidden_size(ln.inputs[0])
        if isinstance(hidden, str):
            return hidden
        folded = _folded_scale_bias(ln, op, match.input(params.affine_node, 1), hidden)
        if isinstance(folded, str):
            return folded
        scale, bias = folded
        dtype = dtype_of(ln.inputs[1])
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
