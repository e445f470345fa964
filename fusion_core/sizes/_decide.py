"""Whether two axes are one size: the proof's word first, the labels only where it
cannot tell.

Labels are what a shape inference wrote, and onnxruntime's symbolic inference
"auto-merges" two sizes it cannot compare under one symbol; the graph's structure
(``SizeProof``) does not lie. So ``proven_equal`` decides from the proven sizes alone
(True, False, or None where a value's own size or an unread chain leaves it open), and
``proven_same`` falls back to the labels (known and equal) only there. One rule for every
stage: canonical's rules and the rewriters (``rewriters/_fused_sizes.same_axis``) decide
sizes with it, so a layout a rule writes and the fusion that reads it agree.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.sizes._proof import SizeProof
from autofusion.fusion_core.sizes._shape_values import Dim, known_dims
from autofusion.fusion_core.sizes._size import Size, is_own

__all__ = ["proven_equal", "proven_other", "proven_same"]

_At = tuple[ir.Value, int]  # a value's axis


def proven_same(proof: SizeProof, *pairs: tuple[_At, _At]) -> bool:
    """Whether, for each pair ``(a, b)``, value ``a[0]`` on axis ``a[1]`` is as long as
    ``b[0]`` on ``b[1]`` (``_same``)."""
    return all(_same(proof, a, b) for a, b in pairs)


def proven_other(proof: SizeProof, at: _At, number: Dim) -> bool:
    """Whether the graph proves the size at ``at`` other than the label ``number``."""
    size = proof.size(*at)
    return size is not None and not is_own(size) and size.value != number


def proven_equal(a: Size | None, b: Size | None) -> bool | None:
    """True where ``a`` and ``b`` are proven one size; False where both are read back to
    the graph's inputs and constants (neither a value's own size) and differ; None where
    the proof cannot tell."""
    if a is not None and a == b:
        return True
    if a is not None and b is not None and not is_own(a) and not is_own(b):
        return False
    return None


def _same(proof: SizeProof, a: _At, b: _At) -> bool:
    """Whether value ``a[0]`` on axis ``a[1]`` is as long as ``b[0]`` on ``b[1]``: by the
    sizes ``proof`` reads from the graph where it decides (``proven_equal``), else by the
    labels (known and equal). Labels can lie (an inference's auto-merge writes one symbol
    for two sizes); they decide only where the graph does not. The rewriters share this
    rule (``rewriters/_fused_sizes.same_axis``)."""
    proven = proven_equal(proof.size(*a), proof.size(*b))
    if proven is not None:
        return proven
    labels = [known_dims(value) for value, _ in (a, b)]
    if labels[0] is None or labels[1] is None:
        return False
    try:
        one, other = labels[0][a[1]], labels[1][b[1]]
    except IndexError:
        return False
    return one is not None and one == other
