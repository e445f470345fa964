"""A head count or head size that a layout rule writes into a new Reshape target.

``head_split`` and ``transpose_after_rotary`` merge ``[B, S, N, H]`` heads to ``[B, S,
N * H]`` and split them again with ``N`` and ``H`` as numbers. The label a value carries
is no proof of them: a ``value_info`` left from before a pass changed the layout can say
``[B, S, 4, 2]`` of ``[B, S, 2, 4]`` heads, and onnxruntime checks such a label only
where its own inference reaches (not through a target computed from shapes, nor through
a contrib op), so the model runs and the split by the label breaks it. The size the
graph proves (``fusion_core.sizes``) decides; the label only where the proof cannot tell
(``proven_equal``: a size no rule ties to others).
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.sizes import Size, SizeProof, proven_equal

__all__ = ["fixed_size"]


def fixed_size(proof: SizeProof, value: ir.Value | None, axis: int) -> int | None:
    """``value``'s size on ``axis`` as a positive number: its label, where the graph
    does not prove another size there; else None."""
    if value is None or value.shape is None or not -len(value.shape) <= axis < len(value.shape):
        return None
    label = value.shape[axis]
    if not isinstance(label, int) or label <= 0:
        return None
    if proven_equal(proof.size(value, axis), Size((), label)) is False:
        return None  # the graph computes another size there: the label is stale
    return label
