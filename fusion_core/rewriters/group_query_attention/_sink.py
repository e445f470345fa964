"""Attention sinks: gpt-oss's learned logit per head, one more column of the scores that
the Softmax normalizes with the keys and that is dropped after it::

    P = Slice(Softmax(Concat(s, E, axis=-1)), 0, -1, axis=-1)     E[b, n, i, 0] = sink[n]

so ``P[j] = exp(s_j) / (exp(sink[n]) + sum_k exp(s_k))``. onnxruntime's CPU
GroupQueryAttention computes exactly that from its input 11 ``head_sink`` (``[num_heads]``,
"a smooth factor adding to the denominator of softmax",
https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.GroupQueryAttention):
its smooth softmax over the keys a query attends takes ``max(m, sink[n])`` as the
shift and adds ``exp(sink[n] - max)`` to the sum, per query head ``n`` (measured against
numpy with onnxruntime 1.32, causal or not, with a bias: within 2e-7,
tests/fusion_core/rewriters/test_group_query_attention_sinks.py). A row whose keys are
all masked gives 0 in both (the sink takes the whole weight), so such rows need no
guard. ``head_sink`` returns the ``[N]`` tensor, or why the block's sink is not one.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.sizes import SizeProof, known_dims, scalar

__all__ = ["head_sink"]

_BROADCASTS = frozenset({"Expand", "Identity"})


def head_sink(
    match: Match,
    nodes: tuple[str, str],
    heads_and_type: tuple[int, ir.DataType | None],
    ctx: RewriteContext,
    proof: SizeProof,
) -> tuple[ir.Value, list[ir.Node]] | str:
    """The ``[heads]`` sink logits of the matched ``Concat`` and ``Slice`` (``nodes``),
    in the type given, and the nodes computing them (none for a constant), or why not."""
    heads, dtype = heads_and_type
    concat, drop = (match.node(n) for n in nodes)
    scores, column = concat.inputs[0], concat.inputs[1]
    if len(concat.inputs) != 2 or scores is None or column is None:
        return (
            f"Concat {concat.name!r} of the attention sinks does not join the scores and one column"
        )
    failure = _drops_last_column(drop, scores, proof)
    if failure is not None:
        return failure
    dims = known_dims(column)
    if dims is None or len(dims) != 4 or dims[1] != heads or dims[3] != 1:
        return f"the sinks {column.name!r} ({dims}) are not one column per head [B, {heads}, S, 1]"
    source = column
    for _ in range(4):  # the per-head logits before their broadcast to every row
        producer = source.producer()
        if producer is None or producer.op_type not in _BROADCASTS:
            break
        source = producer.inputs[0]  # type: ignore[assignment]
    per_head = known_dims(source)
    if per_head is None or len(per_head) != 4 or per_head[::2] != [1, 1] or per_head[3] != 1:
        return f"the sinks {source.name!r} ({per_head}) are not one logit per head [1, N, 1, 1]"
    if per_head[1] not in (1, heads):
        return f"the sinks {source.name!r} hold {per_head[1]} logits for {heads} heads"
    array = constant_array(source)
    if array is not None:
        logits = np.broadcast_to(array.reshape(-1), (heads,)).astype(
            dtype.numpy() if dtype else np.float32
        )
        return ctx.initializer(f"{source.name}_head_sink", np.ascontiguousarray(logits)), []
    if per_head[1] != heads:
        return f"the sinks {source.name!r} are one value computed in the graph for {heads} heads"
    flat = ir.Node(
        "", "Reshape", [source, ctx.initializer("gqa_sink_shape", np.array([-1], np.int64))]
    )
    flat.outputs[0].dtype = source.dtype
    flat.outputs[0].shape = ir.Shape([heads])
    added = [flat]
    if dtype is not None and source.dtype != dtype:
        added.append(ir.Node("", "Cast", [flat.outputs[0]], [ir.AttrInt64("to", dtype)]))
        added[-1].outputs[0].dtype = dtype
    return added[-1].outputs[0], added


def _drops_last_column(drop: ir.Node, scores: ir.Value, proof: SizeProof) -> str | None:
    """Why ``drop`` is not ``Slice(P, 0, -1, axis=-1)``: the first ``L`` columns, the
    scores' own, in order (an end other than -1 proven to keep the scores' sizes)."""
    inputs = list(drop.inputs) + [None] * (5 - len(drop.inputs))
    start, end, axis = (scalar(v) if v is not None else None for v in inputs[1:4])
    step = scalar(inputs[4]) if inputs[4] is not None else 1
    rank = len(scores.shape or ())
    kept = [proof.size(drop.outputs[0], a) for a in range(rank)]
    wanted = [proof.size(scores, a) for a in range(rank)]
    same_shape = rank > 0 and None not in kept and kept == wanted
    if start != 0 or step != 1 or axis not in (-1, 3) or not (end == -1 or same_shape):
        return (
            f"Slice {drop.name!r} after the Softmax does not drop the sinks' column "
            "(not [..., 0:-1] on the last axis)"
        )
    return None
