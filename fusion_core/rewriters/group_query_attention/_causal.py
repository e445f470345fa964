"""Proof that an attention mask is causal: it lets query ``s`` see key ``j`` only if
``j <= P + s``, ``P`` being the past length (0 without a cache).

The mask builders of transformers (``sdpa_mask``, ``eager_mask``) combine boolean
terms with ``And``: the causal one ``kv_idx <= q_idx`` with ``q_idx = Range(P, P + S)``
(``cache_position``) on the query axis and ``kv_idx = Range(0, L)`` on the key axis,
then padding and sliding-window terms. A conjunction implies each of its terms, so one
causal term anywhere under ``And``, ``Expand`` and leading ``Slice`` steps proves the
whole mask causal, whatever the other terms say. Each function returns None when it
proved its claim, else the step that failed.

``P`` and the first position of a query index are sizes proven from the graph
(``fusion_core.sizes``: ``Past``), never the labels an inference put on the values:
onnxruntime's symbolic inference merges symbols it cannot compare, so a position read
from another length (a sequence padded to a chunk) can carry the label of ``P``.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.rewriters.group_query_attention._proven import (
    ZERO,
    Past,
    dim_of,
    said,
    same_size,
)
from autofusion.fusion_core.sizes import Size, SizeProof, axes_of, scalar

__all__ = [
    "allowed_of",
    "causal_failure",
    "causal_term",
    "conjuncts",
    "index_axis",
    "masked_at_most",
]

_MAX_DEPTH = 16
_PASS_THROUGH = frozenset({"Expand", "Identity"})
_NOT_COMPARED = "is neither And nor a comparison of key and query indices"


def allowed_of(bias: ir.Value) -> ir.Value | str:
    """The boolean "may attend" of an additive mask ``Where(allowed, 0, negative)``."""
    producer = bias.producer()
    if producer is None or producer.op_type != "Where":
        return f"the mask {bias.name!r} is not Where(allowed, 0, -inf or lowest)"
    zero, negative = (constant_array(v) for v in producer.inputs[1:3])
    if zero is None or negative is None or not np.all(zero == 0):
        return f"the mask {bias.name!r} is not Where(allowed, 0, -inf or lowest) of constants"
    # compared in float64 (-1e30 as a float16 is -inf)
    if not np.all(negative.astype(np.float64) <= masked_at_most(negative.dtype)):
        return f"the mask {bias.name!r} is not Where(allowed, 0, -inf or lowest) of constants"
    return producer.inputs[0]


def masked_at_most(dtype: np.dtype) -> float:
    """The largest added value that masks a score: its softmax weight ``exp(m + gap)`` is
    0 for any gap between scores the type can hold apart in practice. float32 and wider:
    below -1e30 (float32's lowest, dynamo's and eager attention's). float16 holds no
    such value: its lowest, -65504 (transformers' ``finfo(float16).min``), and -1e4
    (what onnxruntime's float16 converter clips float32's lowest to) leave
    ``exp(m + gap)`` 0 in float32 (the kernels' and Softmax's accumulation) unless a
    masked score exceeds every unmasked one by 9,900, which float16 scores (fp16
    activations, scaled by ``1 / sqrt(H)``) do not reach in a model that runs in fp16."""
    return -1e4 if np.dtype(dtype) == np.float16 else -1e30


def causal_failure(allowed: ir.Value, past: Past) -> str | None:
    """Why ``allowed`` is not shown to imply ``key <= P + query``, or None."""
    return _implies(allowed, past, 0)


def causal_term(node: ir.Node, past: Past) -> bool:
    """Whether ``node`` is the causal term itself, ``key <= P + query`` (non-strict)."""
    return node.op_type in ("LessOrEqual", "GreaterOrEqual") and _comparison(node, past) is None


def conjuncts(allowed: ir.Value) -> list[ir.Value] | None:
    """The terms of an And tree (through Expand and Identity), or None when it is
    deeper than this proof reads."""
    leaves: list[ir.Value] = []
    return leaves if _conjuncts(allowed, leaves, 0) else None


def _conjuncts(value: ir.Value, leaves: list[ir.Value], depth: int) -> bool:
    """Collect the terms of an And tree (through Expand and Identity) into ``leaves``."""
    producer = value.producer()
    if depth > _MAX_DEPTH:
        return False
    if producer is not None and producer.op_type == "And":
        return all(_conjuncts(v, leaves, depth + 1) for v in producer.inputs if v is not None)
    if producer is not None and producer.op_type in _PASS_THROUGH:
        return _conjuncts(producer.inputs[0], leaves, depth + 1)
    leaves.append(value)
    return True


def _implies(value: ir.Value | None, past: Past, depth: int) -> str | None:
    producer = value.producer() if value is not None else None
    if producer is None or depth > _MAX_DEPTH:
        name = value.name if value is not None else None
        return f"no causal term (key <= query position) found above {name!r}"
    op = producer.op_type
    if op == "And":
        reasons = [_implies(v, past, depth + 1) for v in producer.inputs]
        if None in reasons:
            return None
        # name a comparison that is not the causal one before a term that compares nothing
        compared = [r for r in reasons if r is not None and _NOT_COMPARED not in r]
        return (compared or reasons)[0]
    if op in _PASS_THROUGH or (
        op == "Cast" and attribute_value(producer, "to", 0) == ir.DataType.BOOL
    ):
        return _implies(producer.inputs[0], past, depth + 1)
    if op == "Slice":
        reason = _leading_slice(producer)
        return reason or _implies(producer.inputs[0], past, depth + 1)
    return _comparison(producer, past)


def _leading_slice(node: ir.Node) -> str | None:
    """A Slice that keeps query and key indices: start 0 and step 1 on the last two axes."""
    starts, axes = constant_array(node.inputs[1]), None
    if len(node.inputs) > 3 and node.inputs[3] is not None:
        axes = constant_array(node.inputs[3])
    steps = (
        constant_array(node.inputs[4])
        if len(node.inputs) > 4 and node.inputs[4] is not None
        else None
    )
    rank = len(node.inputs[0].shape) if node.inputs[0].shape is not None else None
    if starts is None or rank is None or (len(node.inputs) > 3 and axes is None):
        return f"Slice {node.name!r} of the mask has bounds that are not constant"
    axes_list = list(range(len(starts))) if axes is None else [int(a) % rank for a in axes]
    step_list = [1] * len(axes_list) if steps is None else [int(s) for s in steps]
    for axis, start, step in zip(axes_list, starts.reshape(-1), step_list, strict=True):
        if axis >= rank - 2 and (int(start) != 0 or step != 1):
            return f"Slice {node.name!r} of the mask shifts the query or key axis"
    return None


def _comparison(node: ir.Node, past: Past) -> str | None:
    """``key <= query`` (LessOrEqual(key, query), GreaterOrEqual(query, key), or the
    strict Less/Greater, which imply it)."""
    op = node.op_type
    if op in ("LessOrEqual", "Less"):
        key, query = node.inputs[0], node.inputs[1]
    elif op in ("GreaterOrEqual", "Greater"):
        query, key = node.inputs[0], node.inputs[1]
    else:
        return f"{op} {node.name!r} {_NOT_COMPARED}"
    key_index = _index(key, past.proof)
    if isinstance(key_index, str):
        return key_index
    query_index = _index(query, past.proof)
    if isinstance(query_index, str):
        return query_index
    if key_index != (1, ZERO):
        return f"{key.name!r} is not Range(0, L) along the key axis"
    if query_index[0] != 2 or not same_size(query_index[1], past.length):
        return (
            f"{query.name!r} is not Range(P, P + S) along the query axis with P the past "
            f"length ({past}): its first position is {said(query_index[1])}"
        )
    return None


def index_axis(value: ir.Value, proof: SizeProof) -> tuple[int, Size | None] | None:
    """(axis counted from the end, first value) of an index ``Range(start, _, 1)``
    unsqueezed into a mask's rank, or None when ``value`` is not one."""
    found = _index(value, proof)
    return None if isinstance(found, str) else found


def _index(value: ir.Value, proof: SizeProof) -> tuple[int, Size | None] | str:
    """(axis counted from the end, first value) of a ``Range(start, _, 1)`` unsqueezed
    into a mask's rank (Expand and Cast keep the axis counted from the end)."""
    unsqueezes = []
    for _ in range(_MAX_DEPTH):
        producer = value.producer()
        if producer is None:
            break
        if producer.op_type == "Range":
            if scalar(producer.inputs[2]) != 1:
                return f"Range {producer.name!r} does not step by 1"
            return _axis_after(unsqueezes), dim_of(producer.inputs[0], proof)
        if producer.op_type == "Add":  # dynamo: cache_position = Range(0, S) + P
            start = _shifted_range(producer, proof)
            if isinstance(start, str):
                return start
            return _axis_after(unsqueezes), start[0]
        if producer.op_type == "Unsqueeze":
            axes = axes_of(producer)
            if axes is None:
                return f"Unsqueeze {producer.name!r} has axes that are not constant"
            unsqueezes.append(axes)
        elif producer.op_type == "Reshape" and _as_unsqueeze(producer) is not None:
            unsqueezes.append(_as_unsqueeze(producer))  # type: ignore[arg-type]
        elif producer.op_type not in ("Cast", "Expand", "Identity"):
            break
        value = producer.inputs[0]
    return f"{value.name!r} is not an index (Range) unsqueezed along one axis"


def _shifted_range(node: ir.Node, proof: SizeProof) -> tuple[Size | None] | str:
    """The first value of ``Add(Range(0, _, 1), offset)`` with a scalar offset: the
    offset as a proven size (torch's dynamo exporter spells ``cache_position`` so), as a
    1-tuple, or why it is not one. The
    Range may be a constant ``[0, 1, .., n - 1]``: a graph exported for ``n`` new tokens
    (one, a decode step) has it folded so."""
    for ranged, offset in (node.inputs, reversed(node.inputs)):
        source = ranged.producer() if ranged is not None else None
        if _counts_from_zero(ranged):
            pass
        elif source is None or source.op_type != "Range":
            continue
        elif scalar(source.inputs[0]) != 0 or scalar(source.inputs[2]) != 1:
            return f"Range {source.name!r} does not count 0, 1, 2, ..."
        if offset is None or offset.shape is None or offset.shape.rank() > 1:
            return f"Add {node.name!r} does not add a scalar to its Range"
        return (dim_of(offset, proof),)
    return f"Add {node.name!r} does not shift a Range"


def _counts_from_zero(value: ir.Value | None) -> bool:
    """Whether ``value`` is a constant 1-D ``[0, 1, .., n - 1]``."""
    array = constant_array(value) if value is not None else None
    if array is None or array.ndim != 1 or array.dtype.kind not in "iu" or not array.size:
        return False
    return bool(np.array_equal(array, np.arange(array.size)))


def _as_unsqueeze(node: ir.Node) -> list[int] | None:
    """The axes of the Unsqueeze a Reshape of a 1-D value is (a target of ones but for
    one ``-1``: ``Reshape(Range(P, P + S), [-1, 1])``, the query positions as a column),
    or None."""
    source = node.inputs[0]
    target = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    if source is None or source.shape is None or len(source.shape) != 1 or target is None:
        return None
    entries = [int(t) for t in target.reshape(-1)]
    if entries.count(-1) != 1 or any(t not in (-1, 1) for t in entries):
        return None
    return [k for k, t in enumerate(entries) if t == 1]


def _axis_after(unsqueezes: list[list[int]]) -> int:
    """Where the one axis of a 1-D value ends up, counted from the end (1: the last),
    after the Unsqueezes (listed from the last applied to the first)."""
    axes_list: list[bool] = [True]  # True marks the index axis
    for axes in reversed(unsqueezes):
        rank = len(axes_list) + len(axes)
        inserted = {a % rank for a in axes}
        source = iter(axes_list)
        axes_list = [False if i in inserted else next(source) for i in range(rank)]
    return len(axes_list) - axes_list.index(True)
