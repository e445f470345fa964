"""What a row with nothing to attend to gets after the fused op, as the graph computes
it: 0 (the output multiplied by the rows to keep), or the mean of the values over every
key, picked only when some row is empty (``_empty_rows_guard``: a decode step's query
never is); on the generic target, ONNX Attention's rows the mask covers everywhere."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.rewriters._attention_mask import empty_rows_as_mean
from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.rewriters._empty_rows_guard import (
    every_row_attends,
    every_row_kept,
    unless_every_row_attends,
)
from autofusion.fusion_core.rewriters.group_query_attention._inputs import KVSide
from autofusion.fusion_core.rewriters.group_query_attention._mask import EmptyRows, like

__all__ = ["empty_rows", "generic_empty_rows"]


def empty_rows(
    masked: EmptyRows,
    gqa: ir.Node,
    q_and_groups: tuple[ir.Value, int],
    ctx: RewriteContext,
    nodes: list[ir.Node],
) -> None:
    """What a row with nothing to attend to gets, after the kernel: 0 (multiplied by
    the rows to keep) or the cache's mean value (picked), as the graph computes it; the
    mean, which reads the whole value cache, only when some row is empty
    (``_empty_rows_guard``: a decode step's query never is)."""
    q, groups = q_and_groups
    if masked.keep is None:
        return
    if masked.empty_rows == "mean":
        kept = every_row_kept(masked.keep, ctx, nodes)
        fix: list[ir.Node] = []
        mean = _mean_value(gqa.outputs[2], groups, ctx, fix)
        fix.append(ir.Node("", "Where", [masked.keep, gqa.outputs[0], mean]))
        nodes.append(unless_every_row_attends(kept, fix, gqa.outputs[0], ctx))
    else:
        nodes.append(ir.Node("", "Mul", [gqa.outputs[0], masked.keep]))
    like(nodes[-1].outputs[0], q)


def generic_empty_rows(
    bias: ir.Value,
    attention: ir.Node,
    value: KVSide,
    heads: int,
    ctx: RewriteContext,
    nodes: list[ir.Node],
) -> None:
    """ONNX Attention's rows the mask covers everywhere as the graph computes them, the
    mean of the values over every key (``empty_rows_as_mean``), computed only when the
    mask has such a row (``_empty_rows_guard``); the nodes into ``nodes``."""
    if attention.outputs[0].dtype != ir.DataType.FLOAT:
        return  # float16: nothing put back (``empty_rows_as_mean`` says why)
    attends = every_row_attends(bias, ctx, nodes)
    fix: list[ir.Node] = []
    mean = _values_mean(attention, value, heads // value.heads, ctx, fix)
    mean.dtype = attention.outputs[0].dtype
    fix += empty_rows_as_mean(bias, mean, attention.outputs[0], (heads, value.size), ctx)
    nodes.append(unless_every_row_attends(attends, fix, attention.outputs[0], ctx))
    like(nodes[-1].outputs[0], attention.outputs[0])


def _values_mean(
    attention: ir.Node, value: KVSide, groups: int, ctx: RewriteContext, nodes: list[ir.Node]
) -> ir.Value:
    """``[B, 1, N * H]``: each query head's mean of its KV head's values over every key
    (of the present cache, or of the new values without one); the nodes into ``nodes``."""
    if value.past is not None:
        mean = _mean_value(attention.outputs[2], groups, ctx, nodes)
    else:  # [B, L, kv_heads * H]: its heads' means, each repeated for its query heads
        layout = ctx.initializer("gqa_value_heads", np.array([0, 1, value.heads, 1, value.size]))
        keys = ctx.initializer("gqa_value_keys", np.array([1], np.int64))
        averaged = ir.Node("", "ReduceMean", [value.new, keys], [ir.AttrInt64("keepdims", 1)])
        split = ir.Node("", "Reshape", [averaged.outputs[0], layout])
        repeat = ctx.initializer("gqa_value_repeat", np.array([1, 1, 1, groups, 1], np.int64))
        grown = ir.Node("", "Expand", [split.outputs[0], repeat])
        merged = ctx.initializer("gqa_value_mean_shape", np.array([0, 1, -1], np.int64))
        row = ir.Node("", "Reshape", [grown.outputs[0], merged])
        nodes += [averaged, split, grown, row]
        mean = row.outputs[0]
    return mean


def _mean_value(
    present: ir.Value, groups: int, ctx: RewriteContext, nodes: list[ir.Node]
) -> ir.Value:
    """``[B, 1, N * H]``: each query head's average over every key of its (repeated) KV
    head's values, what a finite mask's row with nothing to attend to computes."""
    if ctx.opset >= 18:
        axes = ctx.initializer("gqa_key_rows", np.array([2], np.int64))
        mean = ir.Node("", "ReduceMean", [present, axes], [ir.AttrInt64("keepdims", 1)])
    else:
        attrs = [ir.AttrInt64s("axes", [2]), ir.AttrInt64("keepdims", 1)]
        mean = ir.Node("", "ReduceMean", [present], attrs)
    heads_axis = ctx.initializer("gqa_heads_axis", np.array([2], np.int64))
    split = ir.Node("", "Unsqueeze", [mean.outputs[0], heads_axis])
    repeat = ctx.initializer("gqa_repeat", np.array([1, 1, groups, 1, 1], np.int64))
    grown = ir.Node("", "Expand", [split.outputs[0], repeat])
    merged = ctx.initializer("gqa_mean_shape", np.array([0, 1, -1], np.int64))
    row = ir.Node("", "Reshape", [grown.outputs[0], merged])
    nodes += [mean, split, grown, row]
    row.outputs[0].dtype = present.dtype
    return row.outputs[0]
