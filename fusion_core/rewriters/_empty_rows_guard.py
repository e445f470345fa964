"""The fix for rows with nothing to attend to, run only when such a row exists.

Under a finite mask a query row the mask covers everywhere is, in the graph, the softmax
of equal scores: the mean of the values over every key. The fused kernels give another
row there (a causal GroupQueryAttention averages only the earlier keys; ONNX Attention in
onnxruntime 1.32 gives 0), so the rewriters put the mean back, which reads the whole value
cache in every layer. A decode step's query (a real token) never has such a row, so the
fix sits in an ``If`` whose condition depends on the mask alone, computed once per mask
and shared by the layers::

    out = If(every_row_attends,
             then_branch: Identity(attention),                     # no row is empty
             else_branch: Where(keep, attention, mean(values)))   # the fix, as before

Exact for every input: where no row is empty the Where would pick ``attention`` in every
row. On GroupQueryAttention's rows to keep the condition is a min and a Cast, no
comparison op: a comparison left in the graph reads as a mask proof that did not fold.

https://onnx.ai/onnx/operators/onnx__If.html: a branch reads the outer graph's values by
name; onnxruntime refuses a branch output that is an outer value itself ("add an Identity
node"), hence the Identity. Measured: docs/benchmarks.md section 31.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.rewriters._shared import mark_shared, shared_value

__all__ = ["every_row_attends", "every_row_kept", "unless_every_row_attends"]


def every_row_kept(keep: ir.Value, ctx: RewriteContext, nodes: list[ir.Node]) -> ir.Value:
    """Scalar bool: every row of ``keep`` (bool, True where a row has a key to attend
    to) is True; built once per ``keep`` (the layers share it), the nodes into ``nodes``."""
    if not keep.name:  # made by this rewrite: named now, so that later layers find it
        keep.name = ctx.fresh_name("empty_rows_keep")
    key = f"empty_rows_all_kept:{keep.name}"
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
    cast = ir.Node("", "Cast", [keep], [ir.AttrInt64("to", ir.DataType.FLOAT)])
    # no axes: every axis, in the attribute form (opset < 18) and the input form alike
    least = ir.Node("", "ReduceMin", [cast.outputs[0]], [ir.AttrInt64("keepdims", 0)])
    kept = ir.Node("", "Cast", [least.outputs[0]], [ir.AttrInt64("to", ir.DataType.BOOL)])
    nodes += [cast, least, kept]
    return _shared_flag(kept, key)


def every_row_attends(mask: ir.Value, ctx: RewriteContext, nodes: list[ir.Node]) -> ir.Value:
    """Scalar bool: every row of the float32 ``mask`` ([B, heads or 1, S, L]) has a key
    above float32's lowest (ONNX Attention reads a row of the lowest as masked); built
    once per mask, the nodes into ``nodes``."""
    if not mask.name:
        mask.name = ctx.fresh_name("empty_rows_mask")
    key = f"empty_rows_attends:{mask.name}"
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
    keys = ctx.initializer("empty_rows_keys", np.array([3], np.int64))
    if ctx.opset >= 18:
        row_max = ir.Node("", "ReduceMax", [mask, keys], [ir.AttrInt64("keepdims", 0)])
    else:
        attrs = [ir.AttrInt64s("axes", [3]), ir.AttrInt64("keepdims", 0)]
        row_max = ir.Node("", "ReduceMax", [mask], attrs)
    # the emptiest row: its largest entry is the smallest of all rows' largest
    least = ir.Node("", "ReduceMin", [row_max.outputs[0]], [ir.AttrInt64("keepdims", 0)])
    lowest = ctx.initializer("lowest", np.array(np.finfo(np.float32).min, np.float32))
    attends = ir.Node("", "Greater", [least.outputs[0], lowest])
    nodes += [row_max, least, attends]
    return _shared_flag(attends, key)


def _shared_flag(node: ir.Node, key: str) -> ir.Value:
    mark_shared(node, key)
    node.outputs[0].type = ir.TensorType(ir.DataType.BOOL)
    node.outputs[0].shape = ir.Shape([])
    return node.outputs[0]


def unless_every_row_attends(
    attends: ir.Value,
    fix: list[ir.Node],
    attention: ir.Value,
    ctx: RewriteContext,
) -> ir.Node:
    """``If(attends)``: the then-branch passes ``attention`` through, the else-branch
    runs ``fix`` (whose last node's first output is the fixed attention). Every value and
    node in the branches is named here: ONNX names are unique across a model's graphs."""
    fixed = fix[-1].outputs[0]
    fixed.type, fixed.shape = attention.type, attention.shape
    copy = ir.Node("", "Identity", [attention])
    copy.outputs[0].type, copy.outputs[0].shape = attention.type, attention.shape
    then_branch = _branch("empty_rows_none", [copy], copy.outputs[0], ctx)
    else_branch = _branch("empty_rows_fixed", fix, fixed, ctx)
    guard = ir.Node(
        "",
        "If",
        [attends],
        [ir.AttrGraph("then_branch", then_branch), ir.AttrGraph("else_branch", else_branch)],
    )
    guard.outputs[0].type, guard.outputs[0].shape = attention.type, attention.shape
    return guard


def _branch(hint: str, nodes: list[ir.Node], output: ir.Value, ctx: RewriteContext) -> ir.Graph:
    for node in nodes:
        node.name = node.name or ctx.fresh_name(f"{hint}_{node.op_type}")
        for value in node.outputs:
            value.name = value.name or ctx.fresh_name(f"{hint}_{node.op_type}_out")
    return ir.Graph([], [output], nodes=nodes, name=ctx.fresh_name(hint))
