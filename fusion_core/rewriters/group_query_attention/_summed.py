"""Proof that a mask summed from two masks is exact as the bias of GroupQueryAttention's
causal kernel: ``M = Where(c1, 0, a) + Where(c2, 0, b)`` (either order), a causal (or
banded) mask beside a padding mask that is causal too, the form ``one_bias`` makes of
GPT-Neo's ``Where(causal, scores, lowest) + attention_mask`` (the 4-D mask
transformers builds from the padding, ``Where(causal AND padding, 0, lowest)``).

Neither term alone is what the graph's softmax sees: a row whose keys the padding masks
fully is not NaN (``b`` is finite) and is not the average of every key either: the keys
after the query (``j > P + s``, ``P`` the past length) get ``a + b``, which float32
rounds to ``-inf`` for two lowest floats, while the query's own key gets at most ``b``
below 0. So the row spreads over the keys the causal term allows, which is what
GroupQueryAttention with ``causal = 1`` and the bias ``M`` gives it. In full, with the
kernel reading ``M`` on the keys ``j <= P + s`` only, the two softmaxes are equal when:

* both ``c1`` and ``c2`` imply ``key <= P + query`` (``causal_failure``): every key the
  kernel drops has ``M = a + b`` in the graph, both terms masked;
* one term, ``c1`` say, is the causal term and sliding windows only (``query_free_terms``
  with no other term): it allows every query its own key (a window of ``W >= 1`` keys
  includes it), so that key has ``M = 0 + (0 or b) >= b``;
* ``b`` is finite (the row's maximum in the kernel is finite: no ``-inf`` row, which the
  kernel would not turn into the graph's NaN), and ``fl(a + b) - b`` is ``-inf`` or at
  most ``-1e30`` (``masked_at_most``), so ``exp(s_j + M_j - max)`` is 0 for each dropped
  key in the graph, as for any mask value these rules read (a score would need to exceed
  1e29 to round otherwise). GPT-Neo's two lowest floats sum to ``-inf``.

The kernel adds ``M`` to its scores in float32 as the graph does, so every key it reads
has the graph's value, with one exception: onnxruntime 1.32's CPU kernel gives 0 for a
row whose largest logit is float32's lowest exactly (measured: all keys at -3.4028235e38,
or those and ``-inf``; -3e38 or -1e30 give the average), where the graph's softmax
averages those keys. So where a level of ``M`` may be the lowest float, the kernel takes
``0.5 * M`` (``halved``): halving is exact in float32 (no subnormals at these sizes) and
keeps ``0``, ``-inf``, the order and the ties of the levels, and a masked level ``v <=
-1e30`` stays at least 5e29 below an unmasked one and absorbs a score as ``v`` does
(``s + v == v`` while ``|s|`` is below half its ulp, 1.9e22 at 5e29), so each softmax
is the same, and no level is the lowest float any more. No row needs fixing after the
kernel (``keep`` is None), and a NaN guard after the Softmax never fires.

The window of ``c1`` (GPT-Neo's local layers: ``tril(ones) xor tril(ones, -W)``) can be
the kernel's ``local_window_size`` only if the keys before the window are swamped as
well: they get ``a + (0 or b)``, at most ``a``, against the own key's ``b``, so
``a - b`` must be ``-inf`` or at most ``-1e30``. With ``a = b`` (GPT-Neo's) a row whose
window keys are all padding spreads in the graph over the window and the unpadded keys
before it alike, and the window stays in the bias (a note says why). Float32 only: a
float16 mask's sums round (``s + -65504`` overflows to ``-inf``) in ways not proven here.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.rewriters.group_query_attention._causal import (
    allowed_of,
    causal_failure,
    masked_at_most,
)
from autofusion.fusion_core.rewriters.group_query_attention._proven import Past
from autofusion.fusion_core.rewriters.group_query_attention._window import (
    MaskTerms,
    query_free_terms,
)

__all__ = ["SummedMask", "summed_mask"]

_ONNX = ("", "ai.onnx")


class SummedMask(NamedTuple):
    """A proven sum of two masks: the whole sum is the bias of a causal kernel."""

    window: int | None  # local_window_size, where proven
    note: str | None  # why the anchor's window stays in the bias
    halved: bool = False  # the kernel takes 0.5 * M: some level of M may be the lowest float


def summed_mask(mask: ir.Value, past: Past) -> SummedMask | str | None:
    """The proof for ``mask = Where(c1, 0, a) + Where(c2, 0, b)`` (module docstring),
    why it fails as a sentence, or None where ``mask`` is not a sum of two such masks."""
    add = mask.producer()
    if add is None or add.op_type != "Add" or add.domain not in _ONNX or len(add.inputs) != 2:
        return None
    terms = [_term(v) for v in add.inputs]
    if any(t is None for t in terms):
        return None
    if mask.dtype != ir.DataType.FLOAT:
        return (
            f"the mask {mask.name!r} sums two masks in {_type_name(mask)}: only a float32 sum "
            "is proven to leave the kernel's rows as the graph's softmax"
        )
    for (allowed, _), value in zip(terms, add.inputs, strict=True):
        why = causal_failure(allowed, past)  # type: ignore[arg-type]
        if why is not None:
            return (
                f"the mask {mask.name!r} sums two masks and {value.name!r} is not proven "  # type: ignore[union-attr]
                f"causal ({why}): the keys after a query would not all be masked twice"
            )
    reasons = []
    for anchor, other in ((terms[0], terms[1]), (terms[1], terms[0])):
        found = _anchored(anchor, other, past)  # type: ignore[arg-type]
        if isinstance(found, SummedMask):
            return found
        reasons.append(found)
    return f"the mask {mask.name!r} sums two masks, and neither order is proven: " + "; ".join(
        reasons
    )


def _term(value: ir.Value | None) -> tuple[ir.Value, float] | None:
    """(allowed, fill) of ``Where(allowed, 0, fill)`` with one constant fill at most
    ``masked_at_most``, or None."""
    if value is None:
        return None
    allowed = allowed_of(value)
    fill = constant_array(value.producer().inputs[2]) if not isinstance(allowed, str) else None  # type: ignore[union-attr]
    if isinstance(allowed, str) or allowed is None or fill is None or fill.size != 1:
        return None
    return allowed, float(fill.reshape(-1)[0])


def _anchored(
    anchor: tuple[ir.Value, float], other: tuple[ir.Value, float], past: Past
) -> SummedMask | str:
    """The proof with ``anchor`` the term that allows every query its own key."""
    (allowed, a), (_, b) = anchor, other
    terms = query_free_terms(allowed, past)
    if not isinstance(terms, MaskTerms) or terms.others:
        why = f" ({terms})" if isinstance(terms, str) else ""
        return (
            f"{allowed.name!r} is not the causal term and sliding windows alone{why}: a "
            "query's own key is not shown allowed by it"
        )
    if not np.isfinite(b):
        return (
            f"the fill beside {allowed.name!r} is {b}: a row it masks fully is -inf, "
            "NaN in the graph"
        )
    with np.errstate(over="ignore"):  # two lowest floats sum to -inf, as in the graph
        dropped = float(np.float32(a) + np.float32(b))  # float32's own rounding
    if not _swamped(dropped, b):
        return (
            f"the keys after a query get {dropped:g} and its own key {b:g} at least: "
            "not far enough below for the graph's softmax to drop them"
        )
    lowest = float(np.finfo(np.float32).min)
    halved = lowest in (a, b, dropped)  # the levels of M besides 0
    if terms.window is None:
        return SummedMask(None, None, halved)
    if _swamped(a, b):
        return SummedMask(terms.window, None, halved)
    note = (
        f"the sliding window of {terms.window} keys stays in the attention bias: the keys "
        f"before it get {a:g} and a query's own padded key {b:g}, so a row whose window is "
        "all padding spreads over the unpadded keys before the window as well in the graph"
    )
    return SummedMask(None, note, halved)


def _swamped(low: float, high: float) -> bool:
    """Whether a key at ``low`` has softmax weight 0 beside one at ``high`` (float32)."""
    return bool(np.isneginf(low) or low - high <= masked_at_most(np.float32))


def _type_name(value: ir.Value) -> str:
    return value.dtype.name if value.dtype is not None else "an unknown type"
