"""The mask as GroupQueryAttention takes it (``mask_of``): the attention bias, the rows
to fix after the kernel, whether the kernel is causal, and its sliding window; or why
the mask cannot be given to it. The proofs are in ``_causal``, ``_window``, ``_padding``
and ``_summed``, the bias built from the query-free terms in ``_bias``."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._attention_mask import attention_bias, guarded_mask
from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.rewriters.group_query_attention._bias import (
    MaskBias,
    any_key_rows,
    shared_bias,
)
from autofusion.fusion_core.rewriters.group_query_attention._causal import (
    allowed_of,
    causal_failure,
)
from autofusion.fusion_core.rewriters.group_query_attention._inputs import KVSide
from autofusion.fusion_core.rewriters.group_query_attention._params import GQAParams
from autofusion.fusion_core.rewriters.group_query_attention._proven import Past
from autofusion.fusion_core.rewriters.group_query_attention._summed import SummedMask, summed_mask

__all__ = ["EmptyRows", "like", "mask_of"]


class EmptyRows(NamedTuple):
    """The mask as the kernel takes it, and what a row with nothing to attend to gets."""

    bias: ir.Value | None
    keep: ir.Value | None  # [B, S, 1], None when no row can be empty
    causal: bool
    nodes: list[ir.Node]
    empty_rows: str = "zero"  # "zero": multiply by keep; "mean": the cache's mean value
    window: int | None = None  # local_window_size: the sliding window the kernel applies
    note: str | None = None  # why a sliding window stays in the bias (a near miss)


def mask_of(
    match: Match,
    params: GQAParams,
    sides: tuple[ir.Value, KVSide, Past],
    heads: int,
    ctx: RewriteContext,
    *,
    need_causal: bool,
) -> EmptyRows | str:
    """The attention bias, the rows to fix after, causal or not and the nodes computing
    them, or why the mask cannot be given to GroupQueryAttention.

    GroupQueryAttention with a cache needs ``causal = 1`` (the CPU kernel refuses a batch
    of several new tokens each otherwise), which is exact only if the mask is causal and
    a row with nothing to attend to gives 0 in both graphs: the SDPA NaN guard over a
    ``-inf`` mask, turned into the keep-rows multiply. A finite mask gives a fully masked
    row the average of every key: with ``causal = 0`` (without a cache) as it is, with
    ``causal = 1`` by picking those rows from the cache's mean value. With attention
    sinks such a row is 0 in the graph and in the kernel (the sink takes its whole
    weight, and no row is NaN): nothing to fix after. ``sides``: the query, the key and
    ``P``."""
    q, key, past = sides
    add = match.node(params.mask_node)
    # the scores the mask is added to: after the soft-cap, the scale, or Q @ K^T itself
    scores = params.softcap_out_node or params.scale_node or params.qk_node
    mask = attention_bias(add, match.node(scores), "GroupQueryAttention")
    if isinstance(mask, str):
        return mask
    sink = params.sink_concat_node is not None
    allowed = allowed_of(mask)
    summed = None
    if isinstance(allowed, str) and need_causal and not sink:  # a sum of two masks
        summed = summed_mask(mask, past)
        if isinstance(summed, SummedMask):  # the whole sum is the bias; no row to fix
            bias, nodes = _halved(mask, ctx) if summed.halved else (mask, [])
            return EmptyRows(bias, None, True, nodes, window=summed.window, note=summed.note)
    shared = (
        None
        if isinstance(allowed, str)
        else shared_bias(
            mask, allowed, ctx, q, key, past=past, causal_kernel=need_causal, sink=sink
        )
    )
    zero_rows = shared is not None and shared.keep is not None and shared.empty_rows == "zero"
    if zero_rows and params.nan_guard_node is None:
        return (
            f"the mask {mask.name!r} holds -inf and no NaN guard follows the Softmax: "
            "a fully masked row is NaN"
        )
    if shared is not None and shared.causal_only:  # the bias: the terms besides the causal
        return EmptyRows(
            shared.bias, shared.keep, True, shared.nodes, shared.empty_rows, shared.window
        )
    whole = _whole_mask(mask, shared, match, params, ctx)
    mean_rows = shared is not None and not isinstance(allowed, str) and not sink
    shape = (key, past, heads, need_causal)
    if not isinstance(whole, str):
        whole = _causal_or_not(whole, mask, allowed, shape, ctx, mean_rows, sink=sink)
    # a sum of two masks the proof refused: its reason says more than the single mask's
    return summed if isinstance(whole, str) and isinstance(summed, str) else whole


def _whole_mask(
    mask: ir.Value,
    shared: MaskBias | None,
    match: Match,
    params: GQAParams,
    ctx: RewriteContext,
) -> EmptyRows | str:
    """The whole mask as the bias (not yet causal), the rows to keep and the nodes
    computing them, or why a fully masked row cannot be matched."""
    if shared is not None:
        return EmptyRows(shared.bias, shared.keep, False, shared.nodes, note=shared.note)
    if params.nan_guard_node is not None:
        guarded = guarded_mask(mask, match.node(params.nan_guard_node), ctx)
        if isinstance(guarded, str):
            return guarded
        return EmptyRows(guarded[0], guarded[1], False, list(guarded[2]))
    if params.sink_concat_node is None:  # with sinks even a -inf row is 0, never NaN
        finite = _finite_where(mask)
        if finite is not None:
            return finite
    return EmptyRows(mask, None, False, [])


def _causal_or_not(
    masked: EmptyRows,
    mask: ir.Value,
    allowed: ir.Value | str,
    shape: tuple[KVSide, Past, int, bool],
    ctx: RewriteContext,
    mean_rows: bool,
    *,
    sink: bool,
) -> EmptyRows | str:
    """The whole mask as the bias: causal where it is proven causal (and its empty rows
    handled), not causal without a cache, else why not. ``shape``: the key side, ``P``,
    the query heads and whether the kernel must be causal."""
    key, past, heads, need_causal = shape
    why = allowed if isinstance(allowed, str) else causal_failure(allowed, past)
    if why is None and (masked.keep is not None or sink):  # empty rows: 0 in both
        return masked._replace(causal=True)
    if key.past is None and why is not None and key.heads == heads and not sink:
        return (  # no decoder's sign
            f"neither a KV cache, grouped KV heads nor a causal mask ({why}): an encoder's "
            "attention: MultiHeadAttention's"
        )
    if key.past is None or not need_causal:
        return masked
    if why is None and mean_rows:  # finite, causal: the empty rows take the mean
        keep = any_key_rows(allowed, ctx, masked.nodes, past.proof)  # type: ignore[arg-type]
        return masked._replace(keep=keep, causal=True, empty_rows="mean")
    if why is None:
        why = (
            f"the mask {mask.name!r} is finite: a fully masked row averages every key, "
            "which causal attention does not"
        )
    return f"with a KV cache GroupQueryAttention must be causal, and {why}"


def _halved(mask: ir.Value, ctx: RewriteContext) -> tuple[ir.Value, list[ir.Node]]:
    """``0.5 * mask``: no level the lowest float, which the kernel reads as no key at all
    (``_summed``)."""
    half = ir.Node("", "Mul", [mask, ctx.initializer("gqa_half", np.array(0.5, np.float32))])
    like(half.outputs[0], mask)
    return half.outputs[0], [half]


def _finite_where(mask: ir.Value) -> str | None:
    """Why ``mask`` is not ``Where(cond, a, b)`` of finite constants, or None."""
    producer = mask.producer()
    arrays = (
        [constant_array(v) for v in producer.inputs[1:]]
        if producer is not None and producer.op_type == "Where"
        else [None]
    )
    if any(a is None for a in arrays) or not all(np.all(np.isfinite(a)) for a in arrays):
        return (
            f"the mask {mask.name!r} is not Where of finite constants: a fully masked row "
            "(-inf) gives NaN, which GroupQueryAttention does not"
        )
    return None


def like(value: ir.Value, source: ir.Value) -> None:
    """``value`` typed and shaped as ``source``."""
    value.type, value.shape = source.type, source.shape
