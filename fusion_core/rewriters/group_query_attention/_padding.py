"""Proof that a term of an attention mask is the padding mask itself: ``t[b, 0, 0, j] =
m[b, j]`` for a 2-D boolean ``m`` (the graph's ``attention_mask``, cast), so that the
bias can read ``m`` instead of the export's computation of ``t``.

transformers' ``sdpa_mask`` indexes the padding mask per (batch, key) with vmap, which
the TorchScript exporter (optimum's decoder export) writes as a gather from the
flattened mask: ``Gather(Flatten(m, axis=2), j + b * L, axis=0)`` with ``j = Range(0,
L)`` on the key axis and ``b = Range(0, B)`` on the batch axis, reshaped to ``[B, 1, 1,
L]``. ``Flatten`` at axis 2 of ``[B, L]`` is ``[B * L, 1]`` in row-major order, so
element ``j + b * L`` is ``m[b, j]``; Reshapes keep that order. ``padding_rows`` returns
``m`` when every step is shown from the known (possibly symbolic) shapes, else None.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.canonical import known_dims
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.rewriters.group_query_attention._causal import dim_of, index_axis

__all__ = ["padding_rows"]


def padding_rows(term: ir.Value) -> ir.Value | None:
    """The 2-D boolean ``m`` with ``term[b, 0, 0, j] = m[b, j]``, or None."""
    dims = known_dims(term)
    if dims is None or len(dims) != 4 or dims[1:3] != [1, 1]:
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
    shape = known_dims(rows)
    if (
        shape is None
        or len(shape) != 2
        or attribute_value(flatten, "axis", 1) != 2
        or rows.dtype != ir.DataType.BOOL
        or shape[0] is None
        or shape[1] is None
        or (dims[0] != 1 and dims[0] != shape[0])
        or dims[3] != shape[1]
    ):
        return None
    if known_dims(gather.outputs[0]) != [shape[0], 1, 1, shape[1], 1]:
        return None  # one gathered element per (batch, key), as many as m has
    return rows if index is not None and _row_major(index, shape[1]) else None


def _row_major(index: ir.Value, width: object) -> bool:
    """``index = j + b * width`` with ``j`` the key index (the last axis) and ``b`` the
    batch index (the first of four)."""
    add = index.producer()
    if add is None or add.op_type != "Add":
        return False
    for key, scaled in (add.inputs, tuple(reversed(add.inputs))):
        mul = scaled.producer() if scaled is not None else None
        if key is None or mul is None or mul.op_type != "Mul" or index_axis(key) != (1, 0):
            continue
        for batch, stride in (mul.inputs, tuple(reversed(mul.inputs))):
            if batch is not None and index_axis(batch) == (4, 0) and dim_of(stride) == width:
                return True
    return False
