"""What GroupQueryAttention reads, traced back from the heads the attention uses:
the ``[B, S, heads * H]`` projections before their head split, the KV cache before the
``Concat(past, new)``, and the proof that ``repeat_kv`` repeats each KV head in place.

Each function returns what it found, or a sentence saying why not (a near miss).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from autofusion.fusion_core.canonical import known_dims
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.rewriters._attention_shapes import heads_of

__all__ = ["KVSide", "head_split", "kv_side", "repeats_heads", "split_source"]


@dataclass(frozen=True)
class KVSide:
    """One of key or value: the new ``[B, S, kv_heads * H]`` tensor, the past
    ``[B, kv_heads, P, H]`` (None without a cache), the ``Concat`` output the graph
    returns as present (None without a cache) and the head count and size."""

    new: ir.Value
    past: ir.Value | None
    present: ir.Value | None
    heads: int
    size: int


def head_split(heads: ir.Value, what: str) -> tuple[ir.Node, ir.Node] | str:
    """The Transpose and the Reshape of ``heads = Transpose(Reshape(x), [0, 2, 1, 3])``,
    or why ``heads`` is not that."""
    transpose = heads.producer()
    if transpose is None or transpose.op_type != "Transpose":
        return f"the {what} {heads.name!r} is not a head split (Transpose of a Reshape)"
    if list(attribute_value(transpose, "perm", []) or []) != [0, 2, 1, 3]:
        return f"Transpose {transpose.name!r} of the {what} is not perm [0, 2, 1, 3]"
    reshape = transpose.inputs[0].producer() if transpose.inputs[0] is not None else None
    if reshape is None or reshape.op_type != "Reshape":
        return f"the {what} heads are not Transpose(Reshape(x)) ({transpose.name!r})"
    return transpose, reshape


def split_source(heads: ir.Value, what: str) -> tuple[ir.Value, tuple[int, int]] | str:
    """``x`` and (heads, head size) of ``heads = Transpose(Reshape(x, [B, S, N, H]),
    [0, 2, 1, 3])``."""
    split = head_split(heads, what)
    if isinstance(split, str):
        return split
    reshape = split[1]
    found = heads_of([reshape])
    if isinstance(found, str):
        return found
    return reshape.inputs[0], found


def kv_side(heads: ir.Value, what: str) -> KVSide | str:
    """The key or value a GroupQueryAttention takes, from the ``[B, kv_heads, L, H]``
    heads the attention reads: ``Concat(past, new, axis=2)`` or the new heads alone."""
    producer = heads.producer()
    past = present = None
    new_heads = heads
    if producer is not None and producer.op_type == "Concat":
        if len(producer.inputs) != 2 or attribute_value(producer, "axis", 0) not in (2, -2):
            return (
                f"Concat {producer.name!r} of the {what} cache does not append along the sequence"
            )
        past, new_heads = producer.inputs
        present = heads
    found = split_source(new_heads, what)
    if isinstance(found, str):
        return found
    new, (count, size) = found
    if past is not None:
        dims = known_dims(past)
        if dims is None or len(dims) != 4 or dims[1] != count or dims[3] != size:
            return (
                f"the past {what} {past.name!r} ({dims}) is not [B, {count}, P, {size}] like "
                "its new heads"
            )
    return KVSide(new, past, present, count, size)


def repeats_heads(unsqueeze: ir.Node, expand: ir.Node, reshape: ir.Node, groups: int) -> str | None:
    """``Reshape(Expand(Unsqueeze(kv, 2), [B, kv, G, L, H]), [B, kv * G, L, H])`` repeats
    each of the ``kv`` heads ``G`` times in place (head ``n`` reads ``n // G``), as
    GroupQueryAttention does: proven from the known (possibly symbolic) shapes."""
    axes = attribute_value(unsqueeze, "axes", None)
    if axes is None and len(unsqueeze.inputs) > 1:
        array = constant_array(unsqueeze.inputs[1])
        axes = None if array is None else [int(a) for a in array.reshape(-1)]
    if axes is None or list(axes) not in ([2], [-3]):
        return f"Unsqueeze {unsqueeze.name!r} of repeat_kv does not add axis 2"
    source = known_dims(unsqueeze.inputs[0])
    grown = known_dims(expand.outputs[0])
    merged = known_dims(reshape.outputs[0])
    if source is None or grown is None or merged is None or len(source) != 4:
        return f"the shapes of repeat_kv ({unsqueeze.name!r} .. {reshape.name!r}) are not known"
    b, kv, length, size = source
    want_grown = [b, kv, groups, length, size]
    if len(grown) != 5 or any(g is None or g != w for g, w in zip(grown, want_grown, strict=True)):
        return f"Expand {expand.name!r} gives {grown}, not {want_grown}"
    if not isinstance(kv, int):
        return f"the KV head count of {unsqueeze.inputs[0].name!r} is not known"
    want_merged = [b, kv * groups, length, size]
    if (
        any(m is None or m != w for m, w in zip(merged, want_merged, strict=True))
        or len(merged) != 4
    ):
        return f"Reshape {reshape.name!r} gives {merged}, not {want_merged}"
    return None
