"""Interleaved rotary angles read from ONE constant table gathered by position, for
``_rotary_pairs``: GPT-J's ``Split(Gather(table, ids))`` (``split_of_gathered``), and
RoFormer's, stacked copies of a part of the table (``copies_of_one``,
``gathered_part``)::

    T = Unsqueeze(Gather(W, ids), [0, 1])          (W: [P, w] constant, ids: [S])
    sin = T[..., 0:h],  cos = T[..., h:2h]         (Slice, or Split of the last axis)
    c2 = Reshape(Concat(Unsqueeze(cos, -1), Unsqueeze(cos, -1), axis=-1), [1, 1, S, r])

(``torch.stack([cos, cos], -1).reshape_as(...)``; the dynamo exporter's Concat reads one
Unsqueeze twice, TorchScript's two Unsqueezes of one value). The stack repeats each
entry twice, so the pair ``(x_2i, x_2i+1)`` turns by the entry ``W[ids[s], a + i]`` of
the part ``[a, a + h)``: onnxruntime's interleaved ``RotaryEmbedding`` with the cache
``W[:, a:a + h]`` read at ``position_ids[b, s] = ids[s]``. Which parts are cosine and
sine is not read from names: ``one_rotation`` proves the two caches are the cosine and
sine of one angle per entry (``cos^2 + sin^2`` one number over the table), as RoFormer's
halves ``sin(pos / 10000^(2i/r))`` and ``cos(...)`` are.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import axes_of, known_dims

__all__ = ["copies_of_one", "gathered_part", "split_of_gathered"]


def copies_of_one(node: ir.Node, rank: int) -> bool:
    """Whether ``node`` is ``Concat(u, u', axis=-1)`` of two copies of one value: the
    same value twice, or two Unsqueezes of one value on the same axes (TorchScript
    writes one Unsqueeze per use). A Concat of copies repeats each entry like
    ``Tile``; the callers check the shapes it takes ``[.., h, 1]`` to ``[.., h, 2]``."""
    if node.op_type != "Concat" or len(node.inputs) != 2:
        return False
    first, second = node.inputs
    if first is None or second is None:
        return False
    if attribute_value(node, "axis", 0) not in (-1, rank - 1):  # rank: the copies', proven
        return False
    if first is second:
        return True
    one, two = first.producer(), second.producer()
    return (
        one is not None
        and two is not None
        and one.op_type == two.op_type == "Unsqueeze"
        and one.inputs[0] is two.inputs[0]
        and axes_of(one) is not None
        and axes_of(one) == axes_of(two)
    )


def gathered_part(value: ir.Value, half: int):
    """``(W[:, a:a + half], ids)`` where ``value`` is the part ``[a, a + half)`` (step 1)
    of the last axis of ``Unsqueeze*(Gather(W, ids))``, cut by a Slice or an equal
    Split before or after the Unsqueezes (a canonical rule moves a Split before them),
    ``W`` a 2-D constant and ``ids`` 1-D, the Unsqueezes adding axes before the gathered
    ``[S, w]`` only. Ranks and the width are read from ``W`` and the ops, not from
    labels. None when ``value`` is not that form."""
    steps: list[tuple[ir.Node, ir.Value]] = []  # (node, its output read), back to the Gather
    source, cuts = value, 0
    while len(steps) < 6:
        producer = source.producer()
        if producer is None or not producer.inputs or producer.inputs[0] is None:
            return None
        if producer.op_type not in ("Unsqueeze", "Slice", "Split"):
            break
        cuts += producer.op_type != "Unsqueeze"
        steps.append((producer, source))
        source = producer.inputs[0]
    gather = source.producer()
    if cuts != 1 or gather is None or gather.op_type != "Gather":
        return None
    table, ids = constant_array(gather.inputs[0]), gather.inputs[1]
    if table is None or table.ndim != 2 or ids is None or ids.shape is None or len(ids.shape) != 1:
        return None
    if attribute_value(gather, "axis", 0) != 0:
        return None
    rank, bounds = 2, None  # [S, w]; each Unsqueeze adds axes before the last two
    for node, out in reversed(steps):
        if node.op_type != "Unsqueeze":
            bounds = _cut(out, node, (rank, int(table.shape[1])), half)
            continue
        axes = axes_of(node)
        if axes is None:
            return None
        rank += len(axes)
        if any(a % rank >= rank - 2 for a in axes):
            return None
    if bounds is None or rank > 4:  # more axes: the angles would broadcast the heads
        return None
    return table[:, bounds[0] : bounds[1]].astype(np.float32), ids


def _cut(
    value: ir.Value, part: ir.Node, shape: tuple[int, int], half: int
) -> tuple[int, int] | None:
    """``[a, a + half)``: the part of the last axis that ``value`` is, cut by a Slice
    (step 1, constant bounds) or an equal Split of a source of ``shape`` (its rank and
    last axis); else None."""
    rank, width = shape
    if part.op_type == "Split":
        if attribute_value(part, "axis", 0) % rank != rank - 1:
            return None
        sizes = constant_array(part.inputs[1]) if len(part.inputs) > 1 else None
        count = len(part.outputs)
        equal = width == count * half if sizes is None else sizes.tolist() == [half] * count
        k = list(part.outputs).index(value)
        return (k * half, (k + 1) * half) if equal else None
    bounds = [constant_array(v) if v is not None else None for v in part.inputs[1:5]]
    if len(bounds) < 3 or any(b is None or b.size != 1 for b in bounds[:3]):
        return None
    step = bounds[3] if len(bounds) > 3 else None
    if int(bounds[2].flat[0]) % rank != rank - 1:  # type: ignore[union-attr]
        return None
    if step is not None and (step.size != 1 or int(step.flat[0]) != 1):
        return None
    start, end = (int(b.flat[0]) for b in bounds[:2])  # type: ignore[union-attr]
    start, end = (min(max(v + width if v < 0 else v, 0), width) for v in (start, end))
    return (start, end) if end - start == half else None


def split_of_gathered(table: ir.Value, half: int) -> tuple[np.ndarray | None, ir.Value | None]:
    """GPT-J's ``Split(Gather(constant [P, 2 * half], ids), [half, half])[k]``: the k-th half
    of the constant and the ids; (None, None) for any other ``c``."""
    split = table.producer()
    if (
        split is None
        or split.op_type != "Split"
        or attribute_value(split, "axis", 0) not in (-1, 2)
    ):
        return None, None
    sizes = (
        constant_array(split.inputs[1])
        if len(split.inputs) > 1 and split.inputs[1] is not None
        else None
    )
    halves = sizes is not None and sizes.tolist() == [half, half]
    if not halves and not (sizes is None and len(split.outputs) == 2):  # num_outputs = 2
        return None, None
    gather = split.inputs[0].producer()
    if gather is None or gather.op_type != "Gather" or attribute_value(gather, "axis", 0) != 0:
        return None, None
    constant = constant_array(gather.inputs[0])
    ids = gather.inputs[1]
    if constant is None or constant.ndim != 2 or constant.shape[1] != 2 * half:
        return None, None
    if known_dims(ids) is None or len(known_dims(ids) or []) != 2:
        return None, None
    k = list(split.outputs).index(table)
    return constant[:, k * half : (k + 1) * half].astype(np.float32), ids
