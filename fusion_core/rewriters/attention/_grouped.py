"""Grouped key/value heads (repeat_kv) as com.microsoft ``MultiHeadAttention``, for a
block GroupQueryAttention cannot take (a mask computed from the values, a value head
size of its own)::

    K' = Reshape(Expand(Unsqueeze(K, 2), ..), [B, N, L, H])       K: [B, KV, L, H]
    V' = (the same of V)                                          V: [B, KV, L, Hv]
    y  = MultiHeadAttention(q, K', V', attention_bias=M, num_heads=N, scale=c)

The repeated heads are the op's key and value: as they are, ``[B, N, L, H]`` (the
kernel's BNSH key and value, which must have the same shape), or with their heads
merged, ``Reshape(Transpose(K', [0, 2, 1, 3]), [0, 0, N * H])``, where ``Hv != H``
(the 3-D key and value may differ in their last axis: ``v_hidden_size``). Both equal
the unfused block to float rounding on onnxruntime 1.32's CPU kernel (probed with
random scores and masks of shape ``[B or 1, N or 1, S, L]``). The repeat is recomputed
by copies of the matched Unsqueeze, Expand and Reshape; the mask stays the bias, exact
for any additive mask.

The generic target (opset 23) emits ONNX ``Attention`` instead, over the same repeated
heads merged to ``[B, L, N * H]`` (its 3-D query takes a 3-D key and value), with
``q_num_heads = kv_num_heads = N``; rows the mask covers everywhere get the graph's
mean of the values back, as on the generic path of ``attention``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._attention_shapes import heads_of
from autofusion.fusion_core.rewriters._base import Rewrite, RewriteContext, opset_refusal
from autofusion.fusion_core.rewriters._fused_sizes import FusedSizeProof, proven_dims
from autofusion.fusion_core.rewriters.attention._rewriter import ATTENTION_OPSET, attention_of
from autofusion.fusion_core.targets import MS_DOMAIN

__all__ = ["grouped_multi_head_attention"]


def grouped_multi_head_attention(
    match: Match, params: Any, repeats: dict[str, list[str]], ctx: RewriteContext
) -> Rewrite | str:
    """The matched block, its key and value heads repeated by repeat_kv, as
    MultiHeadAttention over the repeated heads, or why not. ``params`` names the
    matched nodes as ``AttentionParams`` does, ``repeats`` the Unsqueeze, Expand and
    Reshape of the key's (``"k"``) and the value's (``"v"``) repeat_kv; without them
    (empty), the key and value heads ``$k`` and ``$v`` are ``[B, N, L, H]`` as they are
    (heads repeated in block order by a Tile, picked by a Gather: not a head split)."""
    contrib = ctx.target.can_emit(MS_DOMAIN)
    if not contrib and ctx.opset < ATTENTION_OPSET:
        instead = "the block stays as it is"
        return opset_refusal(
            "ONNX Attention over the repeated heads", ATTENTION_OPSET, ctx, instead
        )
    proof = FusedSizeProof()  # the heads' counts and sizes as proven (labels where it cannot tell)
    heads = heads_of([match.node(params.q_reshape_node)], proof)
    if isinstance(heads, str):
        return heads
    count, size = heads
    nodes: list[ir.Node] = []
    repeated = []
    for what in ("k", "v"):
        names = repeats.get(what)
        if names:  # the matched repeat goes with the rewrite: computed again by copies
            copies = _copied(match, names)
            value = copies[-1].outputs[0]
            dims = proven_dims(match.node(names[-1]).outputs[0], proof)
            nodes += copies
        else:  # heads the block reads as they are (a Tile of heads, a Gather of heads)
            value = match.value(f"${what}")
            if value is None:
                return f"the block reads no {_WORD[what]} heads"
            dims = proven_dims(value, proof)
        if dims is None or len(dims) != 4 or dims[1] != count or not isinstance(dims[3], int):
            return f"the {_WORD[what]} heads {value.name!r} are not [B, {count}, L, H]"
        repeated.append((value, dims[3]))
    (key, key_size), (value, value_size) = repeated
    if key_size != size:
        return f"the key's head size {key_size} is not the query's {size}"
    # BNSH key and value must have one shape, and ONNX Attention's 3-D query takes a 3-D
    # key and value: merge the heads
    if value_size != size or not contrib:
        key, value = (_merged(x, count * s, nodes, ctx) for x, s in repeated)
    query = match.input(params.q_reshape_node, 0)
    heads_and_size = (count, value_size)
    return attention_of(match, params, [query, key, value], heads_and_size, ctx, nodes, proof=proof)


_WORD = {"k": "key", "v": "value"}


def _copied(match: Match, names: list[str]) -> list[ir.Node]:
    """Copies of the matched repeat_kv nodes (the match goes with the rewrite), chained
    as they were from the same key or value heads."""
    copies: list[ir.Node] = []
    for name in names:
        node = match.node(name)
        inputs = list(node.inputs)
        if copies:
            inputs[0] = copies[-1].outputs[0]
        copy = ir.Node(node.domain, node.op_type, inputs, node.attributes.values())
        copy.outputs[0].dtype = node.outputs[0].dtype
        copy.outputs[0].shape = node.outputs[0].shape
        copies.append(copy)
    return copies


def _merged(heads: ir.Value, hidden: int, nodes: list[ir.Node], ctx: RewriteContext) -> ir.Value:
    """``[B, N, L, H]`` heads as ``[B, L, N * H]``: Transpose, then Reshape (its 0s copy B
    and L, so both stay dynamic)."""
    transpose = ir.Node("", "Transpose", [heads], [ir.AttrInt64s("perm", [0, 2, 1, 3])])
    target = ctx.initializer(f"merged_heads_{hidden}", np.array([0, 0, hidden], np.int64))
    reshape = ir.Node("", "Reshape", [transpose.outputs[0], target])
    reshape.outputs[0].dtype = heads.dtype
    if heads.shape is not None and len(heads.shape) == 4:  # ranks for the proof of the batch
        batch, count, length, _ = heads.shape
        transpose.outputs[0].shape = ir.Shape([batch, length, count, heads.shape[3]])
        reshape.outputs[0].shape = ir.Shape([batch, length, hidden])
    nodes += [transpose, reshape]
    return reshape.outputs[0]
