"""Proof that a term of an attention mask is the padding mask itself: ``t[b, 0, 0, j] =
m[b, j]`` for a 2-D boolean ``m`` (the graph's ``attention_mask``, cast), so that the
bias can read ``m`` instead of the export's computation of ``t``.

transformers' ``sdpa_mask`` indexes the padding mask per (batch, key) with vmap, which
the TorchScript exporter (optimum's decoder export) writes as a gather from the
flattened mask: ``Gather(Flatten(m, axis=2), j + b * L, axis=0)`` with ``j = Range(0,
L)`` on the key axis and ``b = Range(0, B)`` on the batch axis, reshaped to ``[B, 1, 1,
L]``. ``Flatten`` at axis 2 of ``[B, L]`` is ``[B * L, 1]`` in row-major order, so
element ``j + b * L`` is ``m[b, j]``; Reshapes keep that order. ``padding_rows`` returns
``m`` when every step is shown, each size proven from the graph (``fusion_core.sizes``:
a term labelled as long as ``m`` may be a prefix of its rows), else None.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.rewriters.group_query_attention._causal import index_axis
from autofusion.fusion_core.rewriters.group_query_attention._proven import (
    ZERO,
    dim_of,
    same_size,
)
from autofusion.fusion_core.sizes import ONE, Size, SizeProof

__all__ = ["padding_rows"]


def padding_rows(term: ir.Value, proof: SizeProof) -> ir.Value | None:
    """The 2-D boolean ``m`` with ``term[b, 0, 0, j] = m[b, j]``, or None."""
    if term.shape is None or len(term.shape) != 4:
        return None
    dims = [proof.size(term, axis) for axis in range(4)]
    if dims[1:3] != [ONE, ONE]:
        return None
    gather = term.producer()
    for _ in range(3):  # Reshapes keep the row-major order of the gathered elements
        if gather is None or gather.op_type != "Reshape":
            break
        gather = gather.inputs[0].producer() if gather.inputs[0] is not None else None
    if gather is None or gather.op_type != "Gather" or attribute_value(gather, "axis", 0) != 0:
        return None
    flat, index = gather.inputs
    flatten = flat.producer() if flat is not None else None
    if flatten is None or flatten.op_type != "Flatten":
        return None
    rows = flatten.inputs[0]
    if (
        rows is None
        or len(rows.shape or ()) != 2
        or attribute_value(flatten, "axis", 1) != 2
        or rows.dtype != ir.DataType.BOOL
    ):
        return None
    batch, width = proof.size(rows, 0), proof.size(rows, 1)
    if (dims[0] != ONE and not same_size(dims[0], batch)) or not same_size(dims[3], width):
        return None
    gathered = gather.outputs[0]
    if len(gathered.shape or ()) != 5:
        return None
    # one gathered element per (batch, key): its last axis is Flatten's second, 1 at axis
    # 2 of a 2-D input (a rule the proof has not, so read from the Flatten itself)
    wanted = [batch, ONE, ONE, width]
    if any(not same_size(proof.size(gathered, a), w) for a, w in enumerate(wanted)):
        return None
    return rows if index is not None and _row_major(index, width, proof) else None  # type: ignore[arg-type]


def _row_major(index: ir.Value, width: Size, proof: SizeProof) -> bool:
    """``index = j + b * width`` with ``j`` the key index (the last axis) and ``b`` the
    batch index (the first of four)."""
    add = index.producer()
    if add is None or add.op_type != "Add":
        return False
    for key, scaled in (add.inputs, tuple(reversed(add.inputs))):
        mul = scaled.producer() if scaled is not None else None
        if key is None or mul is None or mul.op_type != "Mul":
            continue
        if index_axis(key, proof) != (1, ZERO):
            continue
        for batch, stride in (mul.inputs, tuple(reversed(mul.inputs))):
            if batch is None or index_axis(batch, proof) != (4, ZERO):
                continue
            if same_size(dim_of(stride, proof), width):
                return True
    return False
