"""``Max`` and ``Min`` of entries where one is proven at most the other: ``Max(0, S)`` is
``S``, ``Min(2, S + 3)`` is ``2``, ``Max(S, S + 2)`` is ``S + 2``.

Every atom of a ``Size`` is a dimension, never negative, so ``b - a`` is never negative
where ``b`` holds each of ``a``'s atoms (as often) and its number is at least ``a``'s: then
``a <= b`` at every input size, and the extreme is the one the order names. Anything else
stays unread: ``Max(1, S)`` is not ``S`` (a declared length may be 0), and torch.export's
``Max(0, -P + Min(128, P + S))`` (GPT-Neo's query length clamped to its 128 positions)
is ``min(S, max(0, 128 - P))``, a sum of sizes nowhere: a Reshape whose target holds it
still proves the length by counting elements (``_rules._reshape``). A capped size (at
most itself) has no order here.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

import onnx_ir as ir

from autofusion.fusion_core.sizes._size import Size

if TYPE_CHECKING:
    from autofusion.fusion_core.sizes._proof import Entries, SizeProof

__all__ = ["at_most", "extreme_read"]


def at_most(a: Size, b: Size) -> bool:
    """Whether ``a <= b`` at every input size: ``b - a`` is atoms and a number >= 0."""
    if a.capped or b.capped:
        return False
    rest = Counter(b.atoms)
    rest.subtract(a.atoms)
    return all(c >= 0 for c in rest.values()) and b.constant >= a.constant


def extreme_read(proof: SizeProof, node: ir.Node, depth: int) -> Entries | None:
    """``Max`` or ``Min`` of two entries (one entry broadcast against many): the one the
    order names, entry by entry; unread where neither is proven at most the other."""
    if len(node.inputs) != 2:
        return None
    a, b = (proof.entries(v, depth) for v in node.inputs)
    if a is None or b is None or (len(a) != len(b) and 1 not in (len(a), len(b))):
        return None
    larger = node.op_type == "Max"
    n = max(len(a), len(b))
    return [_pick(a[i % len(a)], b[i % len(b)], larger) for i in range(n)]


def _pick(a: Size | None, b: Size | None, larger: bool) -> Size | None:
    if a is None or b is None:
        return None
    if at_most(a, b):
        return b if larger else a
    if at_most(b, a):
        return a if larger else b
    return None
