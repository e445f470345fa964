"""What GroupQueryAttention reads, traced back from the heads the attention uses:
the ``[B, S, heads * H]`` projections before their head split, the KV cache before the
``Concat(past, new)``, and the proof that ``repeat_kv`` repeats each KV head in place.

Each function returns what it found, or a sentence saying why not (a near miss).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._attention_shapes import heads_of
from autofusion.fusion_core.rewriters.group_query_attention._params import GQAParams
from autofusion.fusion_core.rewriters.group_query_attention._proven import said, same_size
from autofusion.fusion_core.sizes import Size, SizeProof, known_dims

__all__ = ["KVSide", "head_split", "kv_side", "kv_sides", "repeats_heads", "split_source"]


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


def split_source(
    heads: ir.Value, what: str, proof: SizeProof
) -> tuple[ir.Value, tuple[int, int]] | str:
    """``x`` and (heads, head size) of ``heads = Transpose(Reshape(x, [B, S, N, H]),
    [0, 2, 1, 3])``."""
    split = head_split(heads, what)
    if isinstance(split, str):
        return split
    reshape = split[1]
    found = heads_of([reshape], proof)
    if isinstance(found, str):
        return found
    return reshape.inputs[0], found


def kv_side(heads: ir.Value, what: str, proof: SizeProof) -> KVSide | str:
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
    found = split_source(new_heads, what, proof)
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


def repeats_heads(repeat: list[ir.Node], groups: int, proof: SizeProof) -> str | None:
    """``Reshape(Expand(Unsqueeze(kv, 2), [B, kv, G, L, H]), [B, kv * G, L, H])`` (the
    ``repeat`` nodes in that order) repeats each of the ``kv`` heads ``G`` times in place
    (head ``n`` reads ``n // G``), as GroupQueryAttention does: each size of the Expand's
    and the Reshape's outputs proven ``kv``'s there (a label may name another length)."""
    unsqueeze, expand, reshape = repeat
    axes = attribute_value(unsqueeze, "axes", None)
    if axes is None and len(unsqueeze.inputs) > 1:
        array = constant_array(unsqueeze.inputs[1])
        axes = None if array is None else [int(a) for a in array.reshape(-1)]
    if axes is None or list(axes) not in ([2], [-3]):
        return f"Unsqueeze {unsqueeze.name!r} of repeat_kv does not add axis 2"
    source, grown, merged = unsqueeze.inputs[0], expand.outputs[0], reshape.outputs[0]
    ranks = [
        len(v.shape) if v is not None and v.shape is not None else 0
        for v in (source, grown, merged)
    ]
    if ranks != [4, 5, 4]:
        return f"the shapes of repeat_kv ({unsqueeze.name!r} .. {reshape.name!r}) are not known"
    b, kv, length, size = (proof.size(source, a) for a in range(4))
    if kv is None or kv.value is None:
        return f"the KV head count of {source.name!r} is not known"  # type: ignore[union-attr]
    for value, wanted in (
        (grown, [b, kv, Size((), groups), length, size]),
        (merged, [b, Size((), kv.value * groups), length, size]),
    ):
        found = [proof.size(value, a) for a in range(len(wanted))]
        if not all(same_size(f, w) for f, w in zip(found, wanted, strict=True)):
            node = expand if value is grown else reshape
            return (
                f"{node.op_type} {node.name!r} of repeat_kv is not proven to give "
                f"{[said(w) for w in wanted]} (proven: {[said(f) for f in found]})"
            )
    return None


def kv_sides(
    match: Match,
    params: GQAParams,
    query: tuple[ir.Value, int],
    proof: SizeProof,
    *,
    narrow: bool = False,
) -> tuple[KVSide, KVSide] | str:
    """Key and value, their caches, and the proof that repeat_kv (if any) maps query
    head ``n`` to KV head ``n // (heads / kv_heads)`` as GroupQueryAttention does;
    ``query``: the ``[B, S, heads * H]`` query and ``heads``; ``narrow``: value heads
    narrower than the key's are taken (to be padded)."""
    q, heads = query
    sides = []
    for what, free in (("key", "$k"), ("value", "$v")):
        side = kv_side(match.value(free), what, proof)
        if isinstance(side, str):
            return side
        sides.append(side)
    key, value = sides
    if (key.past is None) != (value.past is None):
        return "only one of key and value has a past: not a KV cache GroupQueryAttention takes"
    lengths = [proof.size(v, 1) for v in (key.new, q)]
    if not same_size(*lengths):
        return (
            f"the new key {key.new.name!r} must be as long as the query {q.name!r} and is "
            f"not proven so ({said(lengths[0])} against {said(lengths[1])}): a key computed "
            "from a cache of another kind (a latent) or another sequence is not a cache of keys"
        )
    padded = narrow and value.size < key.size
    if key.heads != value.heads or (key.size != value.size and not padded):
        return (
            f"key ({key.heads} x {key.size}) and value ({value.heads} x {value.size}) heads differ"
        )
    if heads % key.heads:
        return f"{heads} query heads do not share {key.heads} KV heads evenly"
    groups = heads // key.heads
    repeats = (
        (params.k_unsqueeze_node, params.k_expand_node, params.k_repeat_node),
        (params.v_unsqueeze_node, params.v_expand_node, params.v_repeat_node),
    )
    for names in repeats:
        if None in names:
            # One KV head needs no repeat: the MatMuls broadcast it to every query head
            # (multi-query attention: Falcon), which is GroupQueryAttention's kv_num_heads=1.
            if groups != 1 and key.heads != 1:
                return f"{heads} query heads read {key.heads} KV heads without a repeat_kv"
            continue
        repeat = [match.node(n) for n in names]  # type: ignore[arg-type]
        failure = repeats_heads(repeat, groups, proof)
        if failure is not None:
            return failure
    return key, value
