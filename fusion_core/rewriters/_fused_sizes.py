"""Sizes proven through the ops earlier fusions emit: ``FusedSizeProof`` is a
``fusion_core.sizes.SizeProof`` whose walk also reads through the rotary, onnxruntime's
norms and activations, the fused attentions' batch and sequence, an ``If`` whose branches
give one size, and a fused op's output marked with the sizes of the value it replaced
(``record_sizes``). Without them a rewrite's proof ends at the first fused op above it:
a decoder's second layer reads its query from the residual stream that the first
layer's fused attention adds to.
"""

from __future__ import annotations

import json

import onnx_ir as ir

from autofusion.fusion_core.sizes import (
    ONE,
    Dim,
    Size,
    SizeProof,
    is_own,
    known_dims,
    proven_equal,
    proven_same,
)

__all__ = [
    "SIZES_MARK",
    "FusedSizeProof",
    "one_or_same",
    "proven_dims",
    "proven_equal",
    "record_sizes",
    "same_axis",
]

_MS = "com.microsoft"
# the metadata of a fused op's last node: the sizes of the value it replaced
SIZES_MARK = "autofusion.sizes"
# ops an earlier fusion emits, which the proof's rules (of the standard ops) do not name:
# how many leading axes of output 0 are input 0's (None: all of them)
_KEPT_AXES: dict[tuple[str, str], int | None] = {
    ("", "RotaryEmbedding"): None,
    ("", "SimplifiedLayerNormalization"): None,
    (_MS, "RotaryEmbedding"): None,
    (_MS, "SkipSimplifiedLayerNormalization"): None,
    (_MS, "SkipLayerNormalization"): None,
    (_MS, "QuickGelu"): None,
    (_MS, "FastGelu"): None,
    (_MS, "BiasGelu"): None,
    (_MS, "Gelu"): None,
    (_MS, "MoE"): None,
    # a query [B, S, D] gives [B, S, D_v] ([B, N, S, H] gives [B, N, S, H_v]): all but the
    # last axis are the query's
    ("", "Attention"): 2,
    (_MS, "GroupQueryAttention"): 2,
    (_MS, "MultiHeadAttention"): 2,
    (_MS, "Attention"): 2,
    # a quantized projection [..., K] by a constant weight gives [..., N]: all but the last
    # axis are its input's (an int4 decoder's q, k and v)
    (_MS, "MatMulNBits"): 2,
    (_MS, "DynamicQuantizeMatMul"): 2,
    (_MS, "MatMulIntegerToFloat"): 2,
}


class FusedSizeProof(SizeProof):
    """A ``SizeProof`` that also reads through the ops earlier fusions emit
    (``_KEPT_AXES``: the rotary, onnxruntime's norms and activations, the fused
    attentions' batch and sequence) and an ``If`` whose branches give one size, which
    the proof's own rules do not name (a Reshape entry it cannot read is the rest of the
    elements in ``sizes`` itself): the next layer's query is as long as the
    residual stream the last attention added to. A value a fusion made (``record_sizes``)
    has the sizes proven for the value it replaced, an equal one."""

    def bound(self, value: ir.Value | None, axis: int, depth: int = 0) -> Size | None:
        node = value.producer() if value is not None else None
        recorded = _recorded(node, value, axis) if node is not None else None
        if recorded is not None:
            return recorded
        if node is not None and node.op_type == "If" and node.domain in ("", "ai.onnx"):
            return self._either_branch(node, value, axis, depth)  # type: ignore[arg-type]
        source = node.inputs[0] if node is not None and node.inputs else None
        if node is None or source is None or value is not node.outputs[0]:
            return super().bound(value, axis, depth)
        domain = "" if node.domain == "ai.onnx" else node.domain
        kept = _KEPT_AXES.get((domain, node.op_type), -1)
        rank = len(value.shape or ())
        at = axis + rank if axis < 0 else axis
        if kept is None and len(source.shape or ()) == rank:
            return self.bound(source, at, depth + 1)
        if kept is not None and kept > 0 and rank == len(source.shape or ()) and at < rank - 1:
            return self.bound(source, at, depth + 1)  # [B, S, E] or [B, N, S, H]: all but the last
        return super().bound(value, axis, depth)

    def _either_branch(self, node: ir.Node, value: ir.Value, axis: int, depth: int) -> Size | None:
        """An ``If``'s output has a size where both branches' outputs are proven to have
        it (an earlier fusion's guard: ``Identity(out)`` or ``out`` with its empty rows
        fixed); else its own."""
        index = list(node.outputs).index(value)
        found = []
        for name in ("then_branch", "else_branch"):
            branch = node.attributes.get(name)
            outputs = branch.value.outputs if branch is not None else []
            if index >= len(outputs) or len(outputs[index].shape or ()) != len(value.shape or ()):
                return super().bound(value, axis, depth)
            found.append(self.bound(outputs[index], axis, depth + 1))
        if found[0] is None or found[0] != found[1] or found[0].capped:
            return super().bound(value, axis, depth)
        return found[0]


def record_sizes(node: ir.Node, replaced: ir.Value, proof: SizeProof) -> None:
    """Mark ``node``, whose output 0 replaces ``replaced`` (an equal value), with the
    sizes proven for ``replaced`` before the rewrite, so that a later rewrite's proof
    reads through the fused op, whose own sizes no rule gives (the next layer's query
    from the residual this attention adds to). Only sizes of the graph's inputs and
    numbers: an inner value's own size is named by an identity of this run."""
    sizes = [proof.size(replaced, axis) for axis in range(len(replaced.shape or ()))]
    kept = [
        None
        if s is None or any(a.startswith("@") for a in s.atoms)
        else [list(s.atoms), s.constant]
        for s in sizes
    ]
    if any(k is not None for k in kept):
        node.metadata_props[SIZES_MARK] = json.dumps(kept)


def _recorded(node: ir.Node, value: ir.Value | None, axis: int) -> Size | None:
    """The size ``record_sizes`` marked on ``node``'s output 0 at ``axis``, or None."""
    text = node.metadata_props.get(SIZES_MARK)
    if text is None or value is not node.outputs[0]:
        return None
    try:
        kept = json.loads(text)
        at = axis + len(kept) if axis < 0 else axis
        entry = kept[at] if 0 <= at < len(kept) and len(kept) == len(value.shape or ()) else None
        return None if entry is None else Size(tuple(sorted(entry[0])), int(entry[1]))
    except (ValueError, TypeError, IndexError, KeyError):
        return None  # not a mark this module wrote


# Decisions on sizes, for the rewriters that once compared labels (``attention``,
# ``rotary``): proven equal, go; proven different, refuse; undecided (a value's own size,
# a chain the proof cannot read), the labels decide as they did. A label is what an
# inference wrote, and onnxruntime's merges two sizes under one symbol.


def same_axis(
    proof: SizeProof, a: tuple[ir.Value | None, int], b: tuple[ir.Value | None, int]
) -> bool:
    """Whether value ``a[0]`` on axis ``a[1]`` is as long as ``b[0]`` on ``b[1]``: by
    the proof where it decides, else by the labels (known and equal):
    ``fusion_core.sizes.proven_same``, the one rule for canonical and the rewriters."""
    return proven_same(proof, (a, b))


def one_or_same(
    proof: SizeProof, a: tuple[ir.Value | None, int], b: tuple[ir.Value | None, int]
) -> bool | None:
    """Whether ``a``'s axis broadcasts against ``b``'s as a table's batch does: False
    where it is 1, True where it is ``b``'s (and not 1), None where neither. Each fact by
    the proof where it decides, else by the labels."""
    size = proof.size(*a)
    one = size == ONE if size is not None and not is_own(size) else _label(*a) == 1
    return False if one else (True if same_axis(proof, a, b) else None)


def proven_dims(value: ir.Value | None, proof: SizeProof) -> list[Dim] | None:
    """``known_dims`` with the proof's word first: a number where it proves one, the
    label where it proves a symbol (None where the label is a number: it lies), the
    label where it cannot tell."""
    labels = known_dims(value)
    if labels is None:
        return None
    dims: list[Dim] = []
    for axis, label in enumerate(labels):
        size = proof.size(value, axis)
        if size is None or is_own(size):
            dims.append(label)
        elif size.value is not None:
            dims.append(size.value)
        else:
            dims.append(label if isinstance(label, str) else None)
    return dims


def _label(value: ir.Value | None, axis: int) -> Dim:
    dims = known_dims(value)
    return dims[axis] if dims is not None and -len(dims) <= axis < len(dims) else None
