"""What GroupQueryAttention takes besides q, k, v and the cache, built once for all
layers where their shapes agree: the bias from the graph's mask, the rows to keep, and
the sequence lengths (``_lengths``).

Every layer of an export slices the model's one mask to its key length (optimum:
``Slice(mask, 0, Shape(K)[2], axis 3)``), a Slice that keeps the whole mask; so the bias
``Where(allowed, 0, lowest)`` and the keep-rows factor are built from the unsliced mask
and shared by the layers (``_shared``), as are the lengths for the same batch, sequence
and past sizes. Every size here is proven from the graph (``_proven``): the Slices kept
whole, the graph input a length is read from and what the layers share, never a label
an inference put on a value (it may give one label to a padded and an unpadded length).

They are built in the mask's type, float32 or float16 (the attention's: the kernel takes
one type). A float16 finite mask (-65504, -1e4) is not float32's lowest: onnxruntime's
CPU has no float16 Add or Softmax kernel and runs both in float32 between Casts, where
``m + s`` keeps ``s``, so a row with nothing to attend to is the softmax of its scores over
every key, about their average only where the scores are small (a normed model's). The
kernel adds its bias in float32 too: its own row is that softmax exactly for the last
query, which sees every key (each decode step's), so that row keeps the kernel's output
(``_last_key_counted``), and the earlier ones of a prefill, which only padded positions
have and generation never reads, take the mean as in float32.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.rewriters._shared import mark_shared, shared_value
from autofusion.fusion_core.rewriters.group_query_attention._inputs import KVSide
from autofusion.fusion_core.rewriters.group_query_attention._lengths import (
    graph_input_with_dim,
)
from autofusion.fusion_core.rewriters.group_query_attention._padding import padding_rows
from autofusion.fusion_core.rewriters.group_query_attention._proven import (
    Past,
    same_size,
)
from autofusion.fusion_core.rewriters.group_query_attention._window import (
    MaskTerms,
    query_free_terms,
)
from autofusion.fusion_core.sizes import ONE, SizeProof

__all__ = ["MaskBias", "any_key_rows", "shared_bias"]

# the types the bias and the rows to keep are built in: the attention's own
_BIAS_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.FLOAT16})


def _lowest(dtype: ir.DataType) -> np.ndarray:
    """The most negative finite value of ``dtype``, 0-d."""
    return np.array(np.finfo(dtype.numpy()).min, dtype.numpy())


def _signature(masked: np.ndarray) -> str:
    """``masked``'s type and value, for the keys of shared values."""
    return f"{masked.dtype.name}:{float(masked)!r}"


class MaskBias(NamedTuple):
    """What GroupQueryAttention takes from the graph's mask, and what follows it."""

    bias: ir.Value | None  # attention_bias, or None when the kernel's causal term is all
    keep: ir.Value | None  # [B, S, 1]: the rows that attend to something, or None
    nodes: list[ir.Node]
    causal_only: bool  # the bias leaves the causal term to the kernel
    # A row with nothing to attend to: "zero" (-inf mask and the NaN guard: 0, a float
    # keep multiplies) or "mean" (a finite mask: every key's average, a bool keep picks)
    empty_rows: str = "zero"
    window: int | None = None  # local_window_size: the kernel applies the sliding window
    note: str | None = None  # why a sliding window stays in the bias (a near miss)


def shared_bias(
    mask: ir.Value,
    allowed: ir.Value,
    ctx: RewriteContext,
    q: ir.Value,
    key: KVSide,
    *,
    past: Past,
    causal_kernel: bool,
    sink: bool = False,
) -> MaskBias | None:
    """The bias for ``mask = Where(allowed, 0, negative)`` in the mask's type (float32
    or float16): the negative value made finite (the type's lowest for -inf), and where
    it was -inf the ``[B, S, 1]`` factor that is 1 where a row may attend to something.
    None when ``allowed`` is not ``[B or 1, 1, S, L]`` (one row per batch for every
    head), or the mask is of another type.

    For a kernel that applies the causal term itself (``causal_kernel``) and a mask that
    is the causal term, terms free of the query and perhaps a sliding window
    (``query_free_terms``), the bias and the rows come from those terms alone (no bias
    at all without any: the causal term and the window leave every row its own key),
    the window goes to the kernel. A finite mask takes that path only with a cache
    (where the kernel must be causal): a row with nothing to attend to averages every
    key in the graph and only the earlier ones in the kernel, so those rows are the
    mean of the cache's values instead (``empty_rows = "mean"``). With attention sinks
    (``sink``) such a row is 0 in the graph and in the kernel alike: no rows to keep.
    float16 is built alike but for one row (the module's docstring); ``past``: ``P`` and
    the proof of sizes."""
    root = _unsliced(allowed, past.proof)
    if len(root.shape or ()) != 4 or past.proof.size(root, 1) != ONE:
        return None
    if mask.dtype not in _BIAS_TYPES:  # the bias and rows below are built in its type
        return None
    negative = constant_array(mask.producer().inputs[2])  # type: ignore[union-attr]
    assert negative is not None
    infinite = bool(np.any(np.isneginf(negative)))
    # -inf as the type's lowest: a kernel's row of -inf alone is NaN, which 0 times the
    # row to keep leaves NaN (float16's -65504 is measured finite in the kernel); CumSum
    # (the rows to keep) is opset 11's
    masked = _lowest(mask.dtype) if infinite else negative.reshape(-1)[:1].reshape(())
    padding_only = causal_kernel and (infinite or key.past is not None or sink) and ctx.opset >= 11
    terms = query_free_terms(root, past) if padding_only else None
    if isinstance(terms, MaskTerms):
        rows = None if sink else infinite  # what an empty row needs: nothing with sinks
        sides = (q, key, past.proof)
        bias, keep, nodes = _padding_bias(terms, root, masked, sides, ctx, zero_rows=rows)
        return MaskBias(bias, keep, nodes, True, "zero" if infinite else "mean", terms.window)
    note = terms if isinstance(terms, str) else None
    nodes: list[ir.Node] = []
    key = f"gqa_bias:{root.name}:{_signature(masked)}"
    bias = shared_value(ctx.graph, key)
    if bias is None:
        zero = ctx.initializer("gqa_attend", np.zeros((), masked.dtype))
        lowest = ctx.initializer("gqa_masked", masked)
        nodes.append(ir.Node("", "Where", [root, zero, lowest]))
        mark_shared(nodes[-1], key)
        bias = nodes[-1].outputs[0]
        bias.dtype = mask.dtype
    keep = _keep_rows(root, ctx, nodes, mask.dtype) if infinite and not sink else None
    return MaskBias(bias, keep, nodes, False, note=note)


def _padding_bias(
    terms: MaskTerms,
    root: ir.Value,
    masked: np.ndarray,
    sides: tuple[ir.Value, KVSide, SizeProof],
    ctx: RewriteContext,
    *,
    zero_rows: bool | None,
) -> tuple[ir.Value | None, ir.Value | None, list[ir.Node]]:
    """The bias ``Where(t, 0, lowest)`` of the query-free terms ``t`` (``[B, 1, 1, L]``)
    expanded to the ``S`` queries (``lowest``: the 0-d ``masked``, in the attention's
    type), and the rows to keep: row ``s`` sees the keys
    ``j <= P + s`` with ``t[j]`` (and ``j > P + s - W`` in a window of ``W``), so it
    keeps iff the running count of ``t`` at ``P + s`` is not 0 (less the count at
    ``P + s - W``; ``CumSum``, its last ``S`` entries): 0 or 1 to multiply by
    (``zero_rows``, in ``masked``'s type), else a bool to pick with; none at all for
    ``zero_rows=None``; ``sides``: the query, the key and the proof of sizes."""
    if not terms.others:
        return None, None, []
    q, key, proof = sides
    out = _Emitter()
    term = _padding_term(terms.others, root, ctx, out, proof)
    bias = _broadcast_bias(term, (root, masked), (q, proof), ctx, out)
    if zero_rows is None:
        return bias, None, out.nodes
    keep_type = ir.DataType.from_numpy(masked.dtype) if zero_rows else ir.DataType.BOOL
    # float16's finite lowest: the last query's row is the kernel's own (module docstring)
    last = not zero_rows and masked.dtype == np.float16 and terms.window is None
    keep = _rows_with_a_key(term, (root, terms.window), key, ctx, out, keep_type, last)
    return bias, keep, out.nodes


class _Emitter:
    """The new nodes in order; ``add`` returns a node's first output."""

    def __init__(self) -> None:
        self.nodes: list[ir.Node] = []

    def add(self, op: str, inputs: list[ir.Value | None], attrs: list[ir.Attr] = ()) -> ir.Value:
        self.nodes.append(ir.Node("", op, inputs, list(attrs)))
        return self.nodes[-1].outputs[0]

    def share(self, key: str, dtype: ir.DataType) -> ir.Value:
        """Mark the last node as the shared value ``key`` (of ``dtype``)."""
        mark_shared(self.nodes[-1], key)
        self.nodes[-1].outputs[0].dtype = dtype
        return self.nodes[-1].outputs[0]


def _padding_term(
    terms: list[ir.Value], root: ir.Value, ctx: RewriteContext, out: _Emitter, proof: SizeProof
) -> ir.Value:
    """The conjunction of the terms, each read from the graph's 2-D mask where it is
    that mask (``padding_rows``)."""
    key = f"gqa_padding:{root.name}"
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
    parts = []
    for term in terms:
        rows = padding_rows(term, proof)
        if rows is not None:
            axes = ctx.initializer("gqa_padding_axes", np.array([1, 2], np.int64))
            term = out.add("Unsqueeze", [rows, axes])
        parts.append(term)
    for other in parts[1:]:
        parts[0] = out.add("And", [parts[0], other])
    return out.share(key, ir.DataType.BOOL) if out.nodes else parts[0]


def _broadcast_bias(
    term: ir.Value,
    mask: tuple[ir.Value, np.ndarray],
    query: tuple[ir.Value, SizeProof],
    ctx: RewriteContext,
    out: _Emitter,
) -> ir.Value:
    """``Expand(Where(t, 0, lowest), [1, 1, S, 1])``: the kernel wants one row per query.
    ``S`` is read from a graph input proven to have it, and the bias shared by the layers
    only then (``_lengths`` says why); ``mask``: the unsliced mask and the 0-d lowest."""
    (root, masked), (q, proof) = mask, query
    source, axis = graph_input_with_dim(ctx.graph, q, 1, proof)
    key = f"gqa_padding_bias:{root.name}:{_signature(masked)}"
    if not source.is_graph_input():
        key += f":{q.name}"
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
    zero = ctx.initializer("gqa_attend", np.zeros((), masked.dtype))
    lowest = ctx.initializer("gqa_masked", masked)
    row = out.add("Where", [term, zero, lowest])
    ones = ctx.initializer("gqa_ones_2", np.array([1, 1], np.int64))
    one = ctx.initializer("gqa_one", np.array([1], np.int64))
    queries = out.add(
        "Shape", [source], [ir.AttrInt64("start", axis), ir.AttrInt64("end", axis + 1)]
    )
    shape = out.add("Concat", [ones, queries, one], [ir.AttrInt64("axis", 0)])
    out.add("Expand", [row, shape])
    return out.share(key, ir.DataType.from_numpy(masked.dtype))


def _rows_with_a_key(
    term: ir.Value,
    mask: tuple[ir.Value, int | None],
    key: KVSide,
    ctx: RewriteContext,
    out: _Emitter,
    keep_type: ir.DataType,
    last_kept: bool = False,
) -> ir.Value:
    """``[B, S, 1]``: whether the running count of ``t`` at ``P + s`` (less the count at
    ``P + s - W`` for a window of ``W``) is above 0, as a bool (``keep_type`` BOOL) or
    0/1 of the float ``keep_type``; ``mask`` is the unsliced mask and the window; the last
    query's row kept whatever its keys (``last_kept``)."""
    root, window = mask
    zero_rows = keep_type != ir.DataType.BOOL
    name = f"gqa_padding_keep:{root.name}:{keep_type.name}:{window}:{last_kept}"
    if key.past is not None and not key.past.is_graph_input():
        name += f":{key.past.name}"  # a past computed in a layer: not shared (_lengths)
    found = shared_value(ctx.graph, name)
    if found is not None:
        return found
    counted = out.add("Cast", [term], [ir.AttrInt64("to", ir.DataType.FLOAT)])
    if last_kept:
        counted = _last_key_counted(counted, ctx, out)
    last = ctx.initializer("gqa_key_axis_scalar", np.array(3, np.int64))
    running = out.add("CumSum", [counted, last])
    if key.past is None:
        first = ctx.initializer("gqa_zero", np.array([0], np.int64))
    else:
        first = out.add("Shape", [key.past], [ir.AttrInt64("start", 2), ir.AttrInt64("end", 3)])
    end = ctx.initializer("gqa_end", np.array([np.iinfo(np.int64).max], np.int64))
    axis = ctx.initializer("gqa_key_axis", np.array([3], np.int64))
    rows = out.add("Slice", [running, first, end, axis])
    if window is not None:
        before = _count_before_window(running, (first, axis), window, ctx, out)
        rows = out.add("Sub", [rows, before])
    if zero_rows:  # counted in float32 (exact to 2**24 keys), 0/1 in the output's type
        rows = out.add("Min", [rows, ctx.initializer("gqa_one_f", np.array(1.0, np.float32))])
        if keep_type != ir.DataType.FLOAT:
            rows = out.add("Cast", [rows], [ir.AttrInt64("to", keep_type)])
    else:
        rows = out.add("Greater", [rows, ctx.initializer("gqa_zero_f", np.array(0.0, np.float32))])
    per_row = ctx.initializer("gqa_rows_shape", np.array([0, -1, 1], np.int64))
    out.add("Reshape", [rows, per_row])
    return out.share(name, keep_type)


def _last_key_counted(counted: ir.Value, ctx: RewriteContext, out: _Emitter) -> ir.Value:
    """``counted`` (``[., 1, 1, L]``) with its last key counted as 1: only the last query's
    running count (at ``P + S - 1 = L - 1``) reads it, so that row, and no other, has a
    key to attend to (``Pad`` of the first ``L - 1`` with a 1)."""
    starts = ctx.initializer("gqa_zero", np.array([0], np.int64))
    ends = ctx.initializer("gqa_but_last", np.array([-1], np.int64))
    axis = ctx.initializer("gqa_key_axis", np.array([3], np.int64))
    before = out.add("Slice", [counted, starts, ends, axis])
    pads = ctx.initializer("gqa_last_pads", np.array([0, 0, 0, 0, 0, 0, 0, 1], np.int64))
    return out.add("Pad", [before, pads, ctx.initializer("gqa_one_f", np.array(1.0, np.float32))])


def _count_before_window(
    running: ir.Value,
    first_and_axis: tuple[ir.Value, ir.Value],
    window: int,
    ctx: RewriteContext,
    out: _Emitter,
) -> ir.Value:
    """The running count at ``P + s - W`` for the ``S`` rows (0 before the first key):
    ``W`` zeros padded before the ``L`` counts, entries ``P`` to ``L`` of the ``L + W``
    (``first_and_axis``: ``[P]`` and the key axis, as 1-D starts and axes of a Slice)."""
    first, axis = first_and_axis
    pads = ctx.initializer("gqa_window_pads", np.array([0, 0, 0, window, 0, 0, 0, 0], np.int64))
    shifted = out.add("Pad", [running, pads])
    end = ctx.initializer("gqa_window_end", np.array([-window], np.int64))
    return out.add("Slice", [shifted, first, end, axis])


def _unsliced(allowed: ir.Value, proof: SizeProof) -> ir.Value:
    """``allowed`` before Slices that keep its whole shape: each size of the Slice's
    output proven the input's (a label may call a prefix as long as the whole)."""
    for _ in range(4):
        producer = allowed.producer()
        if producer is None or producer.op_type != "Slice" or producer.inputs[0] is None:
            break
        before = producer.inputs[0]
        rank = len(before.shape or ())
        if rank != len(allowed.shape or ()) or not all(
            same_size(proof.size(before, a), proof.size(allowed, a)) for a in range(rank)
        ):
            break
        allowed = before
    return allowed


def any_key_rows(
    allowed: ir.Value, ctx: RewriteContext, nodes: list[ir.Node], proof: SizeProof
) -> ir.Value:
    """``[B, S, 1]`` bool: the rows of the whole mask with a key to attend to."""
    root = _unsliced(allowed, proof)
    key = f"gqa_any_key:{root.name}"
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
    rows = _keep_rows(root, ctx, nodes, ir.DataType.FLOAT)
    nodes.append(ir.Node("", "Cast", [rows], [ir.AttrInt64("to", ir.DataType.BOOL)]))
    mark_shared(nodes[-1], key)
    nodes[-1].outputs[0].dtype = ir.DataType.BOOL
    return nodes[-1].outputs[0]


def _keep_rows(
    root: ir.Value, ctx: RewriteContext, nodes: list[ir.Node], dtype: ir.DataType
) -> ir.Value:
    """``[B, S, 1]``: 1 where the row attends to something, 0 elsewhere, in ``dtype``
    (shared per mask and type)."""
    key = f"gqa_keep_rows:{root.name}:{dtype.name}"
    found = shared_value(ctx.graph, key)
    if found is not None:
        return found
    cast = ir.Node("", "Cast", [root], [ir.AttrInt64("to", ir.DataType.FLOAT)])
    axes = ctx.initializer("gqa_key_axis", np.array([3], np.int64))
    if ctx.opset >= 18:
        reduce = ir.Node("", "ReduceMax", [cast.outputs[0], axes], [ir.AttrInt64("keepdims", 0)])
    else:
        attrs = [ir.AttrInt64s("axes", [3]), ir.AttrInt64("keepdims", 0)]
        reduce = ir.Node("", "ReduceMax", [cast.outputs[0]], attrs)
    rows = ir.Node("", "Transpose", [reduce.outputs[0]], [ir.AttrInt64s("perm", [0, 2, 1])])
    nodes += [cast, reduce, rows]
    if dtype != ir.DataType.FLOAT:
        nodes.append(ir.Node("", "Cast", [rows.outputs[0]], [ir.AttrInt64("to", dtype)]))
    mark_shared(nodes[-1], key)
    nodes[-1].outputs[0].dtype = dtype
    return nodes[-1].outputs[0]
