"""Proof that a term of an attention mask is a sliding window: query ``s`` (position
``P + s``, ``P`` the past length) may see key ``j`` only if ``j > P + s - W``, for a
constant ``W >= 1``: the last ``W`` keys up to and including its own position once the
causal term is applied.

transformers' ``sliding_window_overlay`` writes ``kv_idx > q_idx - sliding_window``
with the same key and query indices as the causal term (``_causal``), which the
exporters spell ``Greater(key, Sub(query, W))``. A comparison in either orientation,
strict or not, with a constant added to or subtracted from either index is read as an
affine inequality ``a * key + b * query + c > 0`` over the integers (``x >= y`` is
``x - y + 1 > 0``); it is a window when ``a = 1`` and ``b = -1`` (``key > query - c``,
so ``W = c``). onnxruntime's GroupQueryAttention with ``causal = 1`` and
``local_window_size = W`` lets the query at position ``p`` see the keys ``p - W < j <=
p``, the same set (since microsoft/onnxruntime#25927; before it, ``W + 1`` keys),
measured with the pinned onnxruntime in
tests/fusion_core/rewriters/test_group_query_attention_window.py.
``window_of`` returns ``W``, or why the term is not shown to be that. The term's
queries and keys must be the mask's own (``_on_mask_axes``): by the sizes proven where
they decide, by the labels where the proof leaves them undecided.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.rewriters._fused_sizes import proven_equal
from autofusion.fusion_core.rewriters.group_query_attention._causal import (
    causal_term,
    conjuncts,
    index_axis,
)
from autofusion.fusion_core.rewriters.group_query_attention._proven import (
    Past,
    offset,
    said,
    same_size,
)
from autofusion.fusion_core.sizes import ONE, Size, known_dims, scalar

__all__ = ["MaskTerms", "query_free_terms", "window_of"]

_MAX_DEPTH = 8
# a > b, a >= b, a < b, a <= b as (sign of a - b, what to add for a strict "> 0")
_COMPARISONS = {
    "Greater": (1, 0),
    "GreaterOrEqual": (1, 1),
    "Less": (-1, 0),
    "LessOrEqual": (-1, 1),
}


class MaskTerms(NamedTuple):
    """A mask ``(key <= P + query) AND t1 AND ... [AND key > P + query - W]``."""

    others: list[ir.Value]  # the terms free of the query, [B or 1, 1, 1, L]
    window: int | None = None  # W of a sliding window term, None without one


def query_free_terms(allowed: ir.Value, past: Past) -> MaskTerms | str | None:
    """The other conjuncts of ``allowed = (key <= P + query) AND t1 AND t2 ...``, each
    the same for every query (``[B or 1, 1, 1, L]``, L the mask's own key length), with
    constant-true ones dropped, and the smallest ``W`` of the sliding-window conjuncts
    ``key > P + query - W``; None unless the mask is exactly that (one non-strict causal
    term, every other conjunct free of the query axis or a window), or a sentence when
    only a conjunct that varies with the query is not shown to be a window (what the
    fusion's near miss says).

    Why: GroupQueryAttention applies that causal term and the window itself (``causal``,
    ``local_window_size``), so the bias it needs is the other terms alone, one row
    broadcast over the queries: the export's own ``[B, 1, S, L]`` mask (two Ranges, the
    comparisons, the Expand to every query) is not needed for it, nor for the rows to
    keep (``fusion_core/rewriters/group_query_attention/_bias.py``)."""
    keys = past.proof.size(allowed, 3) if allowed.shape is not None else None
    leaves = conjuncts(allowed)
    if len(allowed.shape or ()) != 4 or keys is None or leaves is None:
        return None
    causal, others, windows, unproven = 0, [], [], []
    for leaf in leaves:
        constant = constant_array(leaf)
        if constant is not None and constant.dtype == np.bool_ and bool(np.all(constant)):
            continue
        producer = leaf.producer()
        if producer is not None and causal_term(producer, past):
            causal += 1
            continue
        if _query_free(leaf, keys, past):
            others.append(leaf)
            continue
        window = window_of(leaf, allowed, past)  # a term that varies with the query
        (unproven if isinstance(window, str) else windows).append(window)
    if causal != 1:
        return None
    if unproven:
        return (
            "the sliding window (a mask term that varies with the query) stays in the "
            f"attention bias, the whole [B, 1, S, L] mask: {unproven[0]}"
        )
    return MaskTerms(others, min(windows) if windows else None)


def _query_free(leaf: ir.Value, keys: Size, past: Past) -> bool:
    """Whether ``leaf`` is ``[B or 1, 1, 1, L]`` with ``L`` the mask's key length, each
    size proven (a term as long as the mask by its label alone may be shorter)."""
    if leaf.shape is None or len(leaf.shape) != 4:
        return False
    sizes = [past.proof.size(leaf, axis) for axis in (1, 2, 3)]
    return sizes[:2] == [ONE, ONE] and same_size(sizes[2], keys)


def window_of(term: ir.Value, mask: ir.Value, past: Past) -> int | str:
    """``W`` of a term that says ``key > query - W`` (``W >= 1`` a constant) on the
    ``mask``'s own query and key axes, or why it is not shown to be one."""
    node = _comparison_below(term)
    if node is None:
        return f"{term.name!r} is not a comparison of key and query indices"
    failure = _on_mask_axes(term, mask, node, past)
    if failure is not None:
        return failure
    sign, strict = _COMPARISONS[node.op_type]
    sides = [_affine(v, past, 0) for v in node.inputs[:2]]
    for side in sides:
        if isinstance(side, str):
            return f"{node.op_type} {node.name!r} compares {side}"
    (ka, qa, ca), (kb, qb, cb) = sides  # type: ignore[misc]
    key, query, constant = sign * (ka - kb), sign * (qa - qb), sign * (ca - cb) + strict
    if (key, query) != (1, -1):
        inequality = f"{key} * key {'-' if query < 0 else '+'} {abs(query)} * query"
        inequality += f" {'-' if constant < 0 else '+'} {abs(constant)} > 0"
        return f"{node.op_type} {node.name!r} says {inequality}, not key > query - W"
    if constant < 1:
        return f"{node.op_type} {node.name!r} is a window of {constant} keys: not one a query sees"
    return constant


def _on_mask_axes(term: ir.Value, mask: ir.Value, node: ir.Node, past: Past) -> str | None:
    """Why ``term`` is not shown to be as long as ``mask`` on its query and key axes (a
    conjunct of the mask is its size there or 1, and a window's indices must be the
    mask's own), or None. Proven sizes decide, axis by axis: equal goes, both read back
    to the graph's inputs and different refuses (a term 1 long where the labels say
    ``L``: one key index compared, the same for every key). Undecided (a value's own
    size, or a size capped by a constant: GPT-Neo's causal buffer sliced by computed
    bounds, ``min(S, max(0, 128 - P))`` rows, which ``proven_equal`` would call
    different), the labels decide as before the proofs."""
    dims, mask_dims = known_dims(term), known_dims(mask)
    for axis, what in ((-2, "queries"), (-1, "keys")):
        size, want = past.proof.size(term, axis), past.proof.size(mask, axis)
        capped = any(s is not None and s.capped for s in (size, want))
        proven = same_size(size, want) or (None if capped else proven_equal(size, want))
        if proven:
            continue
        if proven is False:
            return (
                f"{node.op_type} {node.name!r} is proven {said(size)} long on its {what}, "
                f"the mask {mask.name!r} {said(want)}: not the mask's own {what}"
            )
        labels = [None if d is None or len(d) < 2 else d[axis] for d in (dims, mask_dims)]
        if labels[0] is None or labels[0] != labels[1]:
            return (
                f"{node.op_type} {node.name!r} gives {dims}, not the mask's queries and keys "
                f"{(mask_dims or [None, None])[-2:]}"
            )
    return None


def _comparison_below(value: ir.Value) -> ir.Node | None:
    """The comparison under casts to bool and Identity, or None."""
    for _ in range(_MAX_DEPTH):
        producer = value.producer()
        if producer is None:
            return None
        if producer.op_type in _COMPARISONS:
            return producer
        to_bool = attribute_value(producer, "to", 0) == ir.DataType.BOOL
        if producer.op_type == "Identity" or (producer.op_type == "Cast" and to_bool):
            value = producer.inputs[0]
        else:
            return None
    return None


def _affine(value: ir.Value | None, past: Past, depth: int) -> tuple[int, int, int] | str:
    """(key coefficient, query coefficient, constant) of an index plus or minus
    constants, or a description of what it is instead."""
    if value is None or depth > _MAX_DEPTH:
        return "no value"
    found = index_axis(value, past.proof)
    if found is not None:
        return _index_term(value, *found, past)
    number = scalar(value)
    if number is not None:
        return 0, 0, number
    producer = value.producer()
    if producer is not None and producer.op_type in ("Add", "Sub") and len(producer.inputs) == 2:
        a, b = (_affine(v, past, depth + 1) for v in producer.inputs)
        if isinstance(a, str) or isinstance(b, str):
            return a if isinstance(a, str) else b  # type: ignore[return-value]
        sign = 1 if producer.op_type == "Add" else -1
        return a[0] + sign * b[0], a[1] + sign * b[1], a[2] + sign * b[2]
    return f"{value.name!r}, neither a key or query index nor a constant"


def _index_term(
    value: ir.Value, axis: int, start: Size | None, past: Past
) -> tuple[int, int, int] | str:
    """An index ``Range(start, _, 1)`` on the key axis (the last: ``key + start``) or the
    query axis (the one before it: ``query + start - P``), ``start - P`` proven a number."""
    if axis == 1 and start is not None and start.value is not None:
        return 1, 0, start.value
    shift = offset(start, past.length) if axis == 2 else None
    if shift is not None:
        return 0, 1, shift
    return (
        f"{value.name!r}, an index along axis -{axis} from {said(start)}: neither the key "
        f"index Range(0, L) nor the query index Range(P, P + S) with P the past length ({past})"
    )
