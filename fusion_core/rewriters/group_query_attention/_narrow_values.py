"""Value heads narrower than the query's and key's (MiMo-V2-Flash: q/k heads of 192,
values of 128) for GroupQueryAttention, which takes one head size for all three
("Input 'value' is expected to have same hidden size as key", onnxruntime 1.32; the
value is ``(batch_size, kv_sequence_length, kv_hidden_size)`` like the key in
https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.GroupQueryAttention).
Each value head is padded with zeros to the query's head size ``H``, and each head of
the context cut back to its first ``Hv`` columns::

    P @ [V, 0] = [P @ V, 0]                                  V: [L, Hv], 0: [L, H - Hv]

    v' = Reshape(Pad(Reshape(v, [0, 0, KV, Hv]), [.., 0, H - Hv]), [0, 0, KV * H])
    y  = Reshape(Slice(Reshape(GQA(q, k, v'), [0, 0, N, H]), 0, Hv, axis=-1), [0, 0, N * Hv])

Each context column is the same dot product of a row of ``P`` with one column of ``V``;
the padded columns are 0 and cut off, so the result is exact (the kernel's own rounding,
as for any GroupQueryAttention). Only without a KV cache: the present value the kernel
returns would be the padded ``[B, KV, L, H]``, not the graph's ``[B, KV, L, Hv]``, and the
past value would need padding every step. ``attention_block`` asks for it last, where
neither GroupQueryAttention nor MultiHeadAttention takes the block as it is (attention
sinks: GroupQueryAttention's ``head_sink`` alone).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.rewriters._fused_sizes import FusedSizeProof
from autofusion.fusion_core.rewriters.group_query_attention._inputs import KVSide, kv_side

__all__ = ["narrow_values", "narrowed_context", "padded_values"]

_PAD_OPSET = 13  # Pad's pads and Slice's bounds as inputs, Reshape's 0 copying a dimension


def narrow_values(match: Match) -> bool:
    """Whether the matched block's value heads are narrower than its key heads (as many
    heads, each a head split): what ``padded_values`` pads."""
    proof = FusedSizeProof()
    sides = (("$k", "key"), ("$v", "value"))
    key, value = (kv_side(match.value(ref), what, proof) for ref, what in sides)
    if isinstance(key, str) or isinstance(value, str):
        return False
    return key.heads == value.heads and value.size < key.size


def padded_values(
    value: KVSide, size: int, ctx: RewriteContext, nodes: list[ir.Node], *, contrib: bool
) -> KVSide | str:
    """``value`` with each head padded with zeros to ``size`` columns (the nodes into
    ``nodes``; ``value`` itself where its heads have ``size``), or why not (``contrib``:
    the target takes GroupQueryAttention)."""
    if value.size == size:
        return value
    if not contrib:
        return "value heads narrower than the key's are padded for GroupQueryAttention only"
    if value.past is not None or value.present is not None:
        return (
            f"value heads of {value.size} beside query/key heads of {size} would be padded to "
            f"{size}, and the KV cache's present value would be [B, {value.heads}, L, {size}], "
            f"not the graph's [B, {value.heads}, L, {value.size}]"
        )
    if ctx.opset < _PAD_OPSET:
        return f"padding the value heads needs opset {_PAD_OPSET}, the model has {ctx.opset}"
    kv, narrow = value.heads, value.size
    split = ctx.initializer(
        f"gqa_value_heads_{kv}x{narrow}", np.array([0, 0, kv, narrow], np.int64)
    )
    pads = ctx.initializer(
        f"gqa_value_pads_{size - narrow}", np.array([0] * 7 + [size - narrow], np.int64)
    )
    merge = ctx.initializer(f"gqa_value_merge_{kv * size}", np.array([0, 0, kv * size], np.int64))
    heads = ir.Node("", "Reshape", [value.new, split])
    padded = ir.Node("", "Pad", [heads.outputs[0], pads])
    merged = ir.Node("", "Reshape", [padded.outputs[0], merge])
    for node in (heads, padded, merged):
        node.outputs[0].dtype = value.new.dtype
    nodes += [heads, padded, merged]
    return KVSide(merged.outputs[0], None, None, kv, size)


def narrowed_context(
    context: ir.Value,
    heads: int,
    sizes: tuple[int, int],
    ctx: RewriteContext,
    nodes: list[ir.Node],
) -> None:
    """``[B, S, heads * H]`` with each head cut back to its first ``Hv`` columns, ``[B, S,
    heads * Hv]`` (``sizes``: ``H``, ``Hv``); the nodes into ``nodes``."""
    size, narrow = sizes
    split = ctx.initializer(
        f"gqa_context_heads_{heads}x{size}", np.array([0, 0, heads, size], np.int64)
    )
    bounds = [ctx.initializer(f"gqa_context_{n}", np.array([n], np.int64)) for n in (0, narrow)]
    last = ctx.initializer("gqa_context_last_axis", np.array([-1], np.int64))
    merge = ctx.initializer(
        f"gqa_context_merge_{heads * narrow}", np.array([0, 0, heads * narrow], np.int64)
    )
    per_head = ir.Node("", "Reshape", [context, split])
    cut = ir.Node("", "Slice", [per_head.outputs[0], *bounds, last])
    merged = ir.Node("", "Reshape", [cut.outputs[0], merge])
    for node in (per_head, cut, merged):
        node.outputs[0].dtype = context.dtype
    nodes += [per_head, cut, merged]
