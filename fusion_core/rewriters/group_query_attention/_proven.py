"""Sizes the rewriter relies on, proven from the graph (``fusion_core.sizes``), never
read from the labels an inference put on the values.

onnxruntime's symbolic inference merges symbols it cannot compare (it labelled
Kimi-Linear's padded length, the sequence rounded up to a chunk, ``sequence``: the
label of the unpadded length), and onnx's may give one label to two sizes. So the past
length ``P`` the causal proof compares positions with, the query's and the key's
lengths, the graph input a length is read from and the Slices the mask is read through
are each decided from one ``FusedSizeProof`` per rewrite (``rewriters/_fused_sizes.py``:
the proof read through the ops earlier fusions emit).
"""

from __future__ import annotations

from typing import NamedTuple

import onnx_ir as ir

from autofusion.fusion_core.sizes import Size, SizeProof

__all__ = ["ZERO", "Past", "dim_of", "offset", "past_of", "said", "same_size"]

ZERO = Size((), 0)


class Past(NamedTuple):
    """``P``, the cache's length (0 without a cache; None where not proven), and the
    proof that reads the positions compared with it (one per rewrite)."""

    length: Size | None
    proof: SizeProof

    def __str__(self) -> str:
        return said(self.length)


def past_of(past: ir.Value | None, proof: SizeProof) -> Past:
    """``P`` of a ``[B, kv_heads, P, H]`` cache (0 without one)."""
    return Past(ZERO if past is None else proof.size(past, 2), proof)


def said(size: Size | None) -> str:
    """A proven size as a reader would write it (``past + 1``; an inner value's own
    size as that value and axis, ``q_pad[1]``), or "unproven"."""
    if size is None:
        return "unproven"
    terms = [_atom(a) for a in size.atoms]
    if size.constant or not terms:
        terms.append(str(size.constant))
    return " + ".join(terms)


def _atom(atom: str) -> str:
    if atom.startswith("@"):  # "@{name}#{id}[{axis}]": a value's own size
        return atom[1:].split("#")[0] + atom[atom.rindex("[") :]
    return atom.lstrip("#")  # "#{input}[{axis}]": an unnamed input dimension


def same_size(a: Size | None, b: Size | None) -> bool:
    """Whether two sizes are proven equal (an unproven one equals nothing)."""
    return a is not None and a == b


def offset(size: Size | None, base: Size | None) -> int | None:
    """``size - base`` where it is proven a number (the same symbols on both sides)."""
    if size is None or base is None or size.capped or base.capped:
        return None
    return size.constant - base.constant if sorted(size.atoms) == sorted(base.atoms) else None


def dim_of(value: ir.Value | None, proof: SizeProof) -> Size | None:
    """The size a scalar (or one-element) shape computation equals, proven from the
    graph (``Gather(Shape(past), 2)`` is the past's proven length there), else None."""
    found = proof.entries(value)
    return found[0] if found is not None and len(found) == 1 else None
