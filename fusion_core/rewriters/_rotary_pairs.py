"""The interleaved spelling of a rotary embedding (GPT-J's ``rotate_every_two``), for
``rotary``: what is proven before it becomes an interleaved ``RotaryEmbedding``::

    x_r = x[..., :r]                      (x: [B, S, N, H], the heads before the permute)
    rot = Reshape(Concat(Unsqueeze(-x_r[..., 1::2], -1), Unsqueeze(x_r[..., 0::2], -1),
                         axis=-1), [B, S, N, r])      (rot[2i] = -x[2i + 1], rot[2i + 1] = x[2i])
    y = Concat(x_r * cos + rot * sin, x[..., r:])     (no Slice and Concat when r = H)
    cos = Reshape(Tile(Unsqueeze(Unsqueeze(c, 2), -1), [1, 1, 1, 1, 2]), [Bc, S, 1, r])
        (dynamo: Reshape(Expand(Unsqueeze(c, [2, 4]), [1, 1, 1, 1, 2]), ...))

``c`` is ``[Bc, S, r / 2]``; the Tile (or Expand) repeats each of its entries twice
(``repeat_interleave``), so the pair ``(x_2i, x_2i+1)`` turns by the angle whose cosine
is ``c[..., i]``: onnxruntime's ``RotaryEmbedding`` with ``interleaved = 1`` and the cache
``c`` (``https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md
#com.microsoft.RotaryEmbedding``). GPT-J gathers ``sin`` and ``cos`` from one constant
table, ``Split(Gather(table, position_ids), 2, axis=-1)``: then the cache is that
table's half, indexed by the position ids themselves.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical import axes_of, known_dims, scalar
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value

__all__ = ["interleaved_layout", "interleaved_table", "pairs_source"]

_BIG = 2**31 - 1


def interleaved_layout(match: Match, params) -> tuple[ir.Value, int] | str:
    """(the heads x [B, S, N, H], the rotary dimension r), every slice checked."""
    x = match.value("$x")
    if params.rotary_node is not None:
        x = match.node(params.rotary_node).inputs[0]
    dims = known_dims(x)
    if dims is None or len(dims) != 4 or not all(isinstance(d, int) for d in dims[2:]):
        name = x.name if x is not None else None
        return f"the rotated heads {name!r} are not known to be [B, S, heads, head_size]"
    size = int(dims[3])  # type: ignore[arg-type]
    rotary_dim = size
    if params.rotary_node is not None:
        part = _bounds(match.node(params.rotary_node), size)
        rest = _bounds(match.node(params.pass_node), size)
        if (
            part is None
            or rest is None
            or part[0] != 0
            or part[2] != 1
            or rest != (part[1], size, 1)
        ):
            return f"the slices {part} and {rest} do not split the head {size} in two"
        rotary_dim = part[1]
    if rotary_dim % 2 or rotary_dim == 0:
        return f"the rotary dimension {rotary_dim} is odd"
    even = _bounds(match.node(params.low_node), rotary_dim)
    odd = _bounds(match.node(params.high_node), rotary_dim)
    if even != (0, rotary_dim, 2) or odd != (1, rotary_dim, 2):
        return f"the slices {even} and {odd} are not the even and odd features of {rotary_dim}"
    pairs = match.node(params.rotate_node)
    if attribute_value(pairs, "axis", 0) not in (-1, 4) or len(pairs.inputs) != 2:
        return f"Concat {pairs.name!r} does not pair the features on a new last axis"
    for unsqueeze in (v.producer() for v in pairs.inputs):
        if (
            unsqueeze is None
            or unsqueeze.op_type != "Unsqueeze"
            or axes_of(unsqueeze) not in ([-1], [4])
        ):
            return f"the pairs of {pairs.name!r} are not Unsqueezes on a new last axis"
    flat = match.node(params.flatten_node or "")
    want = [*dims[:3], rotary_dim]
    if known_dims(flat.outputs[0]) != want:
        return f"Reshape {flat.name!r} does not flatten the pairs to {want}"
    return x, rotary_dim


def interleaved_table(value: ir.Value | None, x_dims: list, rotary_dim: int, what: str):
    """(``c`` [Bc, S, r / 2], batched, constant half table or None, position ids or None)
    behind the repeat_interleave of ``value``, or why it is not one."""
    half = rotary_dim // 2
    name = value.name if value is not None else None
    reshape = value.producer() if value is not None else None
    repeat = None
    if reshape is not None and reshape.op_type == "Reshape" and reshape.inputs[0] is not None:
        repeat = reshape.inputs[0].producer()
    if repeat is None or not _repeats_pairs(repeat):
        return (
            f"the {what} {name!r} is not a Reshape of a Tile or Expand repeating each angle twice"
        )
    dims = known_dims(value)
    if dims is None or len(dims) != 4 or dims[2:] != [1, rotary_dim] or dims[1] != x_dims[1]:
        return f"the {what} {name!r} ({dims}) is not [batch or 1, S, 1, {rotary_dim}]"
    table = _unsqueezed_for_pairs(repeat.inputs[0])
    if table is None:
        return (
            f"the {what} {name!r} is not repeated from Unsqueeze(c, [2, 4]) of a [B, S, {half}] c"
        )
    table_dims = known_dims(table)
    if table_dims is None or table_dims[1:] != [x_dims[1], half]:
        return f"the {what} angles {table.name!r} ({table_dims}) are not [batch or 1, S, {half}]"
    batched = table_dims[0] is not None and table_dims[0] == x_dims[0] and table_dims[0] != 1
    if table_dims[0] != 1 and not batched:
        return f"the batch of the {what} angles {table.name!r} is neither 1 nor the heads'"
    constant, ids = _split_of_gathered(table, half)
    return table, batched, constant, ids


def _repeats_pairs(node: ir.Node) -> bool:
    """``Tile(u, [1, 1, 1, 1, 2])`` or ``Expand(u, [1, 1, 1, 1, 2])`` of a ``u`` whose last
    axis is 1: each angle twice, side by side."""
    if node.op_type not in ("Tile", "Expand") or len(node.inputs) < 2:
        return False
    repeats = constant_array(node.inputs[1])
    if repeats is None or repeats.tolist() != [1, 1, 1, 1, 2]:
        return False
    source = known_dims(node.inputs[0])
    return source is not None and len(source) == 5 and source[4] == 1


def _unsqueezed_for_pairs(value: ir.Value | None) -> ir.Value | None:
    """``c`` of ``Unsqueeze(Unsqueeze(c, 2), -1)`` or ``Unsqueeze(c, [2, 4])``, else None."""
    outer = value.producer() if value is not None else None
    if outer is None or outer.op_type != "Unsqueeze":
        return None
    if axes_of(outer) in ([2, 4], [2, -1]):
        return outer.inputs[0]
    inner = outer.inputs[0].producer() if axes_of(outer) in ([-1], [4]) else None
    if inner is None or inner.op_type != "Unsqueeze" or axes_of(inner) != [2]:
        return None
    return inner.inputs[0]


def pairs_source(x: ir.Value, heads: tuple[int, int]) -> ir.Node | None:
    """The Reshape making ``x`` [B, S, N, H] from a [B, S, N * H] projection, or None."""
    reshape = x.producer()
    if reshape is None or reshape.op_type != "Reshape":
        return None
    source = known_dims(reshape.inputs[0])
    dims = known_dims(x)
    if source is None or dims is None or len(source) != 3 or source[:2] != dims[:2]:
        return None
    return reshape if source[2] == heads[0] * heads[1] else None


def _split_of_gathered(table: ir.Value, half: int) -> tuple[np.ndarray | None, ir.Value | None]:
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


def _bounds(node: ir.Node, size: int) -> tuple[int, int, int] | None:
    """(start, end, step) of a Slice of the last axis, ends clamped to ``size``."""
    start, end = scalar(node.inputs[1]), scalar(node.inputs[2])
    axes = scalar(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    step = scalar(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else 1
    if start is None or end is None or axes not in (-1, 3) or step is None or step < 1:
        return None
    return max(start, 0), min(end if end < _BIG else size, size), step
