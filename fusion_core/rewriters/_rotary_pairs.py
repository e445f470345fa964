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

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._fused_sizes import same_axis
from autofusion.fusion_core.rewriters._rotary_gathered import (
    copies_of_one,
    gathered_part,
    split_of_gathered,
)
from autofusion.fusion_core.rewriters._rotary_tables import Heads
from autofusion.fusion_core.sizes import SizeProof, axes_of, known_dims, scalar

__all__ = [
    "heads_first",
    "interleaved_layout",
    "interleaved_table",
    "pairs_source",
    "transposed_heads",
]


def interleaved_layout(match: Match, params, proof: SizeProof) -> tuple[ir.Value, int] | str:
    """(the heads x [B, S, N, H], the rotary dimension r), every slice checked; sizes as
    ``proof`` gives them (the labels where it cannot tell)."""
    x = match.value("$x")
    if params.rotary_node is not None:
        x = match.node(params.rotary_node).inputs[0]
    x_heads = Heads.of(x, proof) if x is not None else None
    dims = x_heads.dims if x_heads is not None else None
    known = (1, 3) if heads_first(x, match.value("$cos")) else (2, 3)
    if dims is None or len(dims) != 4 or not all(isinstance(dims[i], int) for i in known):
        name = x.name if x is not None else None
        return (
            f"the rotated heads {name!r} are not known to be [B, S, heads, head_size], "
            "the transposed heads of a [B, S, heads * head_size] projection or a Slice "
            "of their last axis"
        )
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
    assert x_heads is not None
    flat_dims = x_heads.dims_of(flat.outputs[0])
    kept = all(x_heads.same(flat.outputs[0], axis, axis) for axis in range(3))
    if flat_dims is None or len(flat_dims) != 4 or flat_dims[3] != rotary_dim or not kept:
        return f"Reshape {flat.name!r} does not flatten the pairs to {want}"
    return x, rotary_dim


def heads_first(x: ir.Value | None, cos: ir.Value | None) -> bool:
    """Whether ``x`` is laid out ``[B, N, S, H]``: the transposed heads themselves
    (``transposed_heads``), a part of their last axis cut by a Slice or a Split
    (DeepSeek-V4's rope part ``x[..., -r:]``: either keeps the other three axes), or
    any 4-D ``x`` its ``cos`` broadcasts to from ``Unsqueeze(c, 1)`` of ``[Bc, S, r]``
    (V4's compressed entries, one head ``Unsqueeze(kv, 1)``, and its context
    rotated back): the angles' own axes say where the positions are."""
    if transposed_heads(x):
        return True
    angles = cos.producer() if cos is not None else None
    if angles is not None and angles.op_type == "Unsqueeze" and axes_of(angles) == [1]:
        return len(known_dims(x) or []) == 4
    part = x.producer() if x is not None else None
    if part is None or part.domain not in ("", "ai.onnx") or not part.inputs:
        return False
    size = (known_dims(part.inputs[0]) or [None])[-1]
    if part.op_type == "Slice":
        cut = isinstance(size, int) and _bounds(part, size) is not None
    else:
        cut = part.op_type == "Split" and attribute_value(part, "axis", 0) in (-1, 3)
    return cut and transposed_heads(part.inputs[0])


def transposed_heads(x: ir.Value | None) -> bool:
    """Whether ``x`` is ``Transpose(Reshape(q), [0, 2, 1, 3])``: heads ``[B, N, S, H]``, the
    layout Cohere and GLM rotate in (GPT-J rotates ``[B, S, N, H]``)."""
    transpose = x.producer() if x is not None else None
    if transpose is None or transpose.op_type != "Transpose" or transpose.inputs[0] is None:
        return False
    split = transpose.inputs[0].producer()
    perm = list(attribute_value(transpose, "perm", []) or [])
    return perm == [0, 2, 1, 3] and split is not None and split.op_type == "Reshape"


def interleaved_table(
    value: ir.Value | None, heads: Heads, rotary_dim: int, what: str, *, transposed: bool
):
    """(the angles' table, batched, constant half table or None, position ids or None,
    what the table holds) behind the repeat_interleave of ``value``, or why it is not
    one. What it holds: ``"half"``, the ``[Bc, S, r / 2]`` angles (GPT-J); for
    ``transposed`` heads (``repeated_angles``) ``"pairs"``, each angle twice (Cohere), or
    ``"first"``, the angles in the first half of a wider table (GLM)."""
    if transposed:
        return repeated_angles(value, heads, rotary_dim, what)
    half = rotary_dim // 2
    name = value.name if value is not None else None
    reshape = value.producer() if value is not None else None
    repeat = None
    if reshape is not None and reshape.op_type == "Reshape" and reshape.inputs[0] is not None:
        repeat = reshape.inputs[0].producer()
    if repeat is None or not _repeats_pairs(repeat, heads):
        return (
            f"the {what} {name!r} is not a Reshape of a Tile or Expand repeating each angle twice"
        )
    dims = heads.dims_of(value)
    if dims is None or len(dims) != 4 or dims[2:] != [1, rotary_dim] or not heads.same(value, 1, 1):
        return f"the {what} {name!r} ({dims}) is not [batch or 1, S, 1, {rotary_dim}]"
    table = _unsqueezed_for_pairs(repeat.inputs[0])
    if table is None:
        return (
            f"the {what} {name!r} is not repeated from Unsqueeze(c, [2, 4]) of a [B, S, {half}] c"
        )
    if not heads.covers(table, half, 1):
        shown = heads.dims_of(table)
        return f"the {what} angles {table.name!r} ({shown}) are not [batch or 1, S, {half}]"
    batched = heads.batched(table)
    if batched is None:
        return f"the batch of the {what} angles {table.name!r} is neither 1 nor the heads'"
    constant, ids = split_of_gathered(table, half)
    return table, batched, constant, ids, "half"


def repeated_angles(value: ir.Value | None, heads: Heads, rotary_dim: int, what: str):
    """Cohere's and GLM's table for ``[B, N, S, H]`` heads: ``Unsqueeze(t, 1)`` with ``t``
    elementwise steps (Cos or Sin, Casts, scalar constants) of ``repeat_interleave(f, 2)``
    = ``Reshape(Expand(Unsqueeze(f, -1), [.., 2]), [Bc, S, r])``. The steps act on each
    entry alone, so ``t[..., 2i] == t[..., 2i + 1]``: the pair ``(x_2i, x_2i+1)`` turns by
    the angle whose cosine is ``t[..., 2i]``, and the cache is ``t[..., 0::2]``."""
    name = value.name if value is not None else None
    unsqueeze = value.producer() if value is not None else None
    if unsqueeze is not None and unsqueeze.op_type == "Reshape":
        return _first_half_repeated(unsqueeze, heads, rotary_dim, what)
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or axes_of(unsqueeze) != [1]:
        return f"the {what} {name!r} is not Unsqueeze(t, 1) of a [batch or 1, S, r] table"
    table = unsqueeze.inputs[0]
    if not heads.covers(table, rotary_dim, 2):
        shown = heads.dims_of(table)
        return f"the {what} table {table.name!r} ({shown}) is not [batch or 1, S, {rotary_dim}]"
    batched = heads.batched(table)
    if batched is None:
        return f"the batch of the {what} table {table.name!r} is neither 1 nor the heads'"
    repeated = _repeated_through_steps(table, rotary_dim, heads)
    if repeated is not None:
        return f"cannot show that the {what} table {table.name!r} repeats each angle: {repeated}"
    return table, batched, None, None, "pairs"


def _first_half_repeated(reshape: ir.Node, heads: Heads, rotary_dim: int, what: str):
    """GLM's ``repeat_interleave(Unsqueeze(c, 1)[..., : r / 2], 2)``: the pairs turn by
    the angles of ``c[..., :r / 2]``, whatever the rest of ``c`` holds."""
    name = reshape.outputs[0].name
    failure = _interleaves_by_two(reshape, rotary_dim, heads)
    if failure is not None:
        return f"cannot show that the {what} {name!r} repeats each angle: {failure}"
    half = rotary_dim // 2
    expand = reshape.inputs[0].producer()
    pairs = expand.inputs[0].producer()  # type: ignore[union-attr]  # checked above
    source = pairs.inputs[0]  # type: ignore[union-attr]
    gathered = gathered_part(source, half) if source is not None else None
    if gathered is not None:  # RoFormer: a part of one table gathered by position
        constant, ids = gathered
        if not heads.same(ids, 0, 2):
            return (
                f"the position ids {ids.name!r} of the {what} table do not cover the S of "
                f"the heads ({heads.shown(ids, 0, 2)})"
            )
        return source, False, constant, ids, "half"
    part = source.producer() if source is not None else None
    if part is None or part.op_type != "Slice" or _bounds(part, rotary_dim) != (0, half, 1):
        return f"the repeated {what} angles of {name!r} are not t[..., :{half}]"
    unsqueeze = part.inputs[0].producer() if part.inputs[0] is not None else None
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or axes_of(unsqueeze) != [1]:
        return f"the {what} angles of {name!r} are not Unsqueeze(c, 1)[..., :{half}]"
    table = unsqueeze.inputs[0]
    if not heads.covers(table, rotary_dim, 2):
        shown = heads.dims_of(table)
        return f"the {what} table {table.name!r} ({shown}) is not [batch or 1, S, {rotary_dim}]"
    batched = heads.batched(table)
    if batched is None:
        return f"the batch of the {what} table {table.name!r} is neither 1 nor the heads'"
    return table, batched, None, None, "first"


_STEPS = frozenset({"Cos", "Sin", "Cast", "Identity"})


def _repeated_through_steps(value: ir.Value, rotary_dim: int, heads: Heads) -> str | None:
    """Why ``value`` is not elementwise steps of a repeat_interleave by 2, or None."""
    for _ in range(8):
        producer = value.producer()
        if producer is None:
            return f"{value.name!r} is not computed in the graph"
        if producer.op_type in _STEPS:
            value = producer.inputs[0]
            continue
        if producer.op_type in ("Mul", "Div") and _scalar_constant(producer.inputs[1]):
            value = producer.inputs[0]
            continue
        if producer.op_type == "Mul" and _scalar_constant(producer.inputs[0]):
            value = producer.inputs[1]
            continue
        if producer.op_type == "Reshape":
            return _interleaves_by_two(producer, rotary_dim, heads)
        return f"{producer.op_type} {producer.name!r} is not an elementwise step of the angle"
    return "the angle's computation is longer than the steps followed"


def _scalar_constant(value: ir.Value | None) -> bool:
    array = constant_array(value) if value is not None else None
    return array is not None and array.size == 1


def _interleaves_by_two(reshape: ir.Node, rotary_dim: int, heads: Heads) -> str | None:
    """Why ``reshape`` is not ``Reshape(Expand|Tile(Unsqueeze(f, -1)), [.., r])`` taking
    ``[.., r / 2, 1]`` to ``[.., r / 2, 2]`` and back to ``[.., r]``, or None."""
    repeat = reshape.inputs[0].producer() if reshape.inputs[0] is not None else None
    # numbers as proven (``heads.dims_of``); the leading axes kept, proven (``heads.proof``)
    source = heads.dims_of(repeat.inputs[0]) if repeat is not None and repeat.inputs else None
    stacked = repeat is not None and source is not None and copies_of_one(repeat, len(source))
    if repeat is None or (repeat.op_type not in ("Expand", "Tile") and not stacked):
        return f"Reshape {reshape.name!r} does not flatten an Expand, a Tile or a stack of copies"
    out = heads.dims_of(repeat.outputs[0])
    flat = heads.dims_of(reshape.outputs[0])
    half = rotary_dim // 2
    if source is None or out is None or flat is None or len(source) not in (4, 5):
        return f"the shapes around {repeat.name!r} are not known"
    lead = len(source) - 2
    kept = [
        all(same_axis(heads.proof, (v, i), (repeat.inputs[0], i)) for i in range(lead))
        for v in (repeat.outputs[0], reshape.outputs[0])
    ]
    if source[-2:] != [half, 1] or out[-2:] != [half, 2] or len(out) != len(source) or not kept[0]:
        return f"{repeat.op_type} {repeat.name!r} ({source} -> {out}) does not pair each angle"
    if len(flat) != lead + 1 or flat[-1] != rotary_dim or not kept[1]:
        return f"Reshape {reshape.name!r} ({flat}) does not flatten the pairs to {rotary_dim}"
    unsqueeze = repeat.inputs[0].producer()
    if (
        unsqueeze is None
        or unsqueeze.op_type != "Unsqueeze"
        or axes_of(unsqueeze) not in ([-1], [len(source) - 1])
    ):
        return f"the paired angles of {repeat.name!r} are not Unsqueeze(f, -1)"
    return None


def _repeats_pairs(node: ir.Node, heads: Heads) -> bool:
    """``Tile(u, [1, 1, 1, 1, 2])`` or ``Expand(u, [1, 1, 1, 1, 2])`` of a ``u`` whose last
    axis is 1: each angle twice, side by side."""
    if node.op_type not in ("Tile", "Expand") or len(node.inputs) < 2:
        return False
    repeats = constant_array(node.inputs[1])
    if repeats is None or repeats.tolist() != [1, 1, 1, 1, 2]:
        return False
    source = heads.dims_of(node.inputs[0])
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


def pairs_source(x_heads: Heads, heads: tuple[int, int]) -> ir.Node | None:
    """The Reshape making ``x`` [B, S, N, H] from a [B, S, N * H] projection (its batch
    and sequence kept: proven, or labelled alike where the proof cannot tell), or None."""
    x = x_heads.value
    reshape = x.producer()
    if reshape is None or reshape.op_type != "Reshape":
        return None
    source = x_heads.dims_of(reshape.inputs[0])
    if source is None or len(source) != 3:
        return None
    if not all(x_heads.same(reshape.inputs[0], axis, axis) for axis in range(2)):
        return None
    return reshape if source[2] == heads[0] * heads[1] else None


def _bounds(node: ir.Node, size: int) -> tuple[int, int, int] | None:
    """(start, end, step) of a Slice of the last axis as ONNX reads them: a negative
    bound counts from the end (DeepSeek-V4's ``x[..., -r:]``), both clamped to
    ``[0, size]``."""
    start, end = scalar(node.inputs[1]), scalar(node.inputs[2])
    axes = scalar(node.inputs[3]) if len(node.inputs) > 3 and node.inputs[3] is not None else None
    step = scalar(node.inputs[4]) if len(node.inputs) > 4 and node.inputs[4] is not None else 1
    if start is None or end is None or axes not in (-1, 3) or step is None or step < 1:
        return None
    start, end = (min(max(v + size if v < 0 else v, 0), size) for v in (start, end))
    return start, end, step
