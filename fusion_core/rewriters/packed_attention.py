"""``packed_attention`` (onnxruntime only): an encoder's Q/K/V projections and its
MultiHeadAttention as one com.microsoft.Attention with the packed weight inside
(https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.Attention)::

    q = x @ Wq + bq;  k = x @ Wk + bk;  v = x @ Wv + bv
    MultiHeadAttention(q, k, v, attention_bias=m, num_heads=N, scale=s)
      = Attention(x, [Wq | Wk | Wv], [bq | bk | bv], attention_bias=m, num_heads=N, scale=s)

The weights are concatenated along their output axis (``[hidden, 3 * hidden]``), the
biases likewise; MultiHeadAttention's additive mask (its input 5) is Attention's input 5.
Where ``qkv_bias_merge`` ran first (it is a default and fuses in the same round as
``attention``), the projections are already one MatMul by ``[Wq | Wk | Wv]``, one
Add and a Split into three equal parts on the last axis (``merged_nodes``): that weight
and bias go in as they are.
A MultiHeadAttention with a packed bias (input 3), a key padding mask (input 4) or a
past is left as it is, with that reason. The patterns
(``fusion_core/patterns/builtin/attention_packed.yaml``) are defaults since they measured
level or faster (docs/benchmarks.md, section 16).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._base import Params, Rewrite, RewriteContext, Rewriter
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["PackedAttention"]

_UNSUPPORTED = {3: "a packed bias", 4: "a key padding mask", 6: "a past key", 7: "a past value"}


class PackedAttentionParams(Params):
    # (MatMul, bias Add) of Q, K and V, in that order
    projections: tuple[tuple[str, str], ...] = (
        ("q_mm", "q_add"),
        ("k_mm", "k_add"),
        ("v_mm", "v_add"),
    )
    # or the merged form: (MatMul, bias Add, Split) of qkv_bias_merge; empty: unused
    merged_nodes: tuple[str, ...] = ()
    attention_node: str = "mha"


class PackedAttention(Rewriter):
    name = "packed_attention"
    targets = frozenset({"onnxruntime"})
    Params = PackedAttentionParams

    def rewrite(
        self, match: Match, params: PackedAttentionParams, ctx: RewriteContext
    ) -> Rewrite | str:
        mha = match.node(params.attention_node)
        for index, what in _UNSUPPORTED.items():
            if index < len(mha.inputs) and mha.inputs[index] is not None:
                return f"MultiHeadAttention {mha.name!r} has {what} (input {index})"
        if any(out.uses() for out in mha.outputs[1:]):
            return f"MultiHeadAttention {mha.name!r} returns its present key and value"
        if params.merged_nodes:
            packed = _merged(match, *params.merged_nodes)
        else:
            packed = _packed(match, params)
        if isinstance(packed, str):
            return packed
        weight, bias = packed
        first = params.merged_nodes[0] if params.merged_nodes else params.projections[0][0]
        x = match.node(first).inputs[0]
        mask = mha.inputs[5] if len(mha.inputs) > 5 else None
        attrs = [ir.AttrInt64("num_heads", int(attribute_value(mha, "num_heads")))]
        scale = attribute_value(mha, "scale", None)
        if scale is not None:
            attrs.append(ir.AttrFloat32("scale", float(scale)))
        ctx.use_domain(MS_DOMAIN)
        inputs = [
            x,
            ctx.initializer(f"{mha.name or 'attention'}_qkv_weight", weight),
            ctx.initializer(f"{mha.name or 'attention'}_qkv_bias", bias),
            None,  # mask_index
            None,  # past
            mask,
        ]
        while inputs[-1] is None:
            inputs.pop()
        node = ir.Node(MS_DOMAIN, "Attention", inputs, attrs)
        return Rewrite([node], [(mha.outputs[0], node.outputs[0])])


def _merged(match: Match, mm: str, add: str, split: str) -> tuple[np.ndarray, np.ndarray] | str:
    """The merged weight and bias, if the Split cuts them into three equal parts on the
    last axis (Q, K, V in that order, as the MultiHeadAttention reads them)."""
    projection = _weight_and_bias(match, mm, add)
    if isinstance(projection, str):
        return projection
    weight, bias = projection
    node = match.node(split)
    sizes = _split_sizes(node)
    rank = node.inputs[0].shape.rank() if node.inputs[0].shape is not None else None
    axis = attribute_value(node, "axis", 0)
    if sizes is None or len(sizes) != 3 or len(set(sizes)) != 1 or sum(sizes) != weight.shape[1]:
        return f"the Split {node.name!r} does not cut the projection into three equal parts"
    if not (axis == -1 or (rank is not None and axis == rank - 1)):
        return f"the Split {node.name!r} is not on the last axis (axis {axis})"
    return weight, bias


def _split_sizes(node: ir.Node) -> list[int] | None:
    """Split's sizes: its input 1 (opset >= 13) or ``split`` attribute, else None."""
    if len(node.inputs) > 1 and node.inputs[1] is not None:
        sizes = constant_array(node.inputs[1])
        return None if sizes is None else [int(s) for s in sizes.reshape(-1)]
    sizes = attribute_value(node, "split", None)
    return None if sizes is None else [int(s) for s in sizes]


def _packed(match: Match, params: PackedAttentionParams) -> tuple[np.ndarray, np.ndarray] | str:
    """The weights and biases concatenated along the output axis, or why not."""
    weights, biases = [], []
    for mm, add in params.projections:
        projection = _weight_and_bias(match, mm, add)
        if isinstance(projection, str):
            return projection
        weight, bias = projection
        weights.append(weight)
        biases.append(bias)
    if len({w.shape for w in weights}) != 1:
        return f"the Q, K and V weights differ in shape ({[w.shape for w in weights]})"
    return np.concatenate(weights, axis=1), np.concatenate(biases)


def _weight_and_bias(match: Match, mm: str, add: str) -> tuple[np.ndarray, np.ndarray] | str:
    """A projection's constant ``[in, out]`` weight and ``[out]`` bias, or why not."""
    weight = constant_array(match.input(mm, 1))
    bias = constant_array(match.input(add, 1))
    if weight is None or bias is None or weight.ndim != 2 or bias.shape != weight.shape[1:]:
        return (
            f"the projection {match.node(mm).name!r} is not a constant [in, out] weight "
            "with a constant [out] bias"
        )
    return weight, bias
