"""Shape proofs for the attention rewriters (``attention``, ``group_query_attention``,
``rotary``): the head split and merge Reshapes, K^T.

Each function returns what it proved, or a sentence saying why not (a near miss).
Which sizes a Reshape keeps or swaps, and the hidden size its heads split, are proven
from the graph where the caller passes a proof (``FusedSizeProof``, ``fusion_core.sizes``:
a target's entries read from shapes, 0 copies, -1 the rest), not read from the labels an
inference put on the values, which may name two sizes alike. Every rewriter passes one
(``attention``, ``rotary``, ``group_query_attention``); the labels decide only where the
proof cannot tell (``_labels_keep``, ``proven_dims``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, attribute_value
from autofusion.fusion_core.rewriters._base import Params, scale_factor
from autofusion.fusion_core.rewriters._fused_sizes import proven_dims
from autofusion.fusion_core.sizes import Dim, SizeProof, is_own, known_dims


class HeadNodes(Params):
    """The pattern nodes of the query's head split and of repeat_kv that the attention
    rewriters (``group_query_attention``, ``attention_block``) both name."""

    q_reshape_node: str = "q_reshape"
    q_transpose_node: str = "q_t"
    k_unsqueeze_node: str | None = None  # repeat_kv of the key: Unsqueeze, Expand, Reshape
    k_expand_node: str | None = None
    k_repeat_node: str | None = None
    v_unsqueeze_node: str | None = None  # and of the value
    v_expand_node: str | None = None
    v_repeat_node: str | None = None


def target_entries(reshape: ir.Node) -> list[int | None] | str:
    """The Reshape target, entry by entry (None where not a constant): a constant, or a
    Concat of 1-D parts (exporters build ``[B, S]`` from Shape and the rest constant)."""
    target = reshape.inputs[1]
    array = constant_array(target)
    if array is not None:
        return [int(a) for a in array.reshape(-1)]
    producer = target.producer() if target is not None else None
    if producer is None or producer.op_type != "Concat":
        return f"the target of Reshape {reshape.name!r} is neither a constant nor a Concat"
    entries: list[int | None] = []
    for part in producer.inputs:
        array = constant_array(part)
        if array is not None:
            entries += [int(a) for a in array.reshape(-1)]
        elif part is not None and part.shape is not None and part.shape.is_static():
            entries += [None] * int(np.prod(part.shape.numpy(), dtype=np.int64))
        else:
            return f"the length of part {part.name!r} of the target of {reshape.name!r} is unknown"
    return entries


def _keeps_axes(reshape: ir.Node, source: ir.Value, axes: range, proof: SizeProof | None) -> bool:
    """Whether the Reshape's output is proven as large as ``source`` on each of ``axes``
    (its B and S: see the callers); without a ``proof``, whether the labels say so."""
    if proof is None:
        return _labels_keep(reshape, source, axes)
    out = reshape.outputs[0]
    sizes = [(proof.size(source, axis), proof.size(out, axis)) for axis in axes]
    if all(a is not None and a == b for a, b in sizes):
        return True
    # Not proven either way: the source's size is a value's own (the proof does not read
    # it back to the inputs: a hybrid's convolution state sliced by computed bounds, a
    # padding mask multiplied in, LFM2), so the labels decide as they did before the
    # proofs; the check runs the fused model at other sizes. Where both sides are read
    # back to the inputs and differ, the Reshape does not keep them.
    read_back = [a is not None and b is not None and not (is_own(a) or is_own(b)) for a, b in sizes]
    if any(known and a != b for known, (a, b) in zip(read_back, sizes, strict=True)):
        return False
    return _labels_keep(reshape, source, axes)


def _labels_keep(reshape: ir.Node, source: ir.Value, axes: range) -> bool:
    """Whether each of ``axes`` of the Reshape's output is ``source``'s by its target (a
    0 that copies, the same number) or by the labels inferred on both."""
    entries = target_entries(reshape)
    dims = known_dims(source)
    if isinstance(entries, str) or dims is None:
        return False
    return all(i < len(dims) and _keeps_dim(reshape, entries, i, dims[i]) for i in axes)


def _keeps_dim(reshape: ir.Node, entries: list[int | None], i: int, want: Dim) -> bool:
    """Whether output dimension ``i`` of the Reshape is ``want`` (a known dimension)."""
    if want is None or i >= len(entries):
        return False
    entry = entries[i]
    if entry == 0 and not attribute_value(reshape, "allowzero", 0):
        return True  # copies dimension i of the input, which is B or S (see the callers)
    if entry is not None and entry == want:
        return True
    out = known_dims(reshape.outputs[0])
    return out is not None and len(out) > i and out[i] == want


def heads_of(splits: list[ir.Node], proof: SizeProof | None = None) -> tuple[int, int] | str:
    """(N, H) read from the head-split Reshapes, which must agree and keep [B, S]
    (proven by ``proof``; by the labels without one)."""
    found = None
    for reshape in splits:
        source = reshape.inputs[0]
        # the hidden size a -1 entry resolves with: a number the proof gives outranks a
        # label (an inference may label a [B, S, 64] projection 32)
        dims = known_dims(source) if proof is None else proven_dims(source, proof)
        if dims is None or len(dims) != 3 or not isinstance(dims[2], int):
            return f"{source.name!r} (read by Reshape {reshape.name!r}) is not [B, S, hidden]"
        entries = target_entries(reshape)
        if isinstance(entries, str):
            return entries
        if len(entries) != 4:
            return f"Reshape {reshape.name!r} does not split into [B, S, heads, head_size]"
        heads, size = entries[2], entries[3]
        if heads == -1 and size is not None and size > 0 and dims[2] % size == 0:
            heads = dims[2] // size
        if size == -1 and heads is not None and heads > 0 and dims[2] % heads == 0:
            size = dims[2] // heads
        if heads is None or size is None or heads <= 0 or size <= 0 or heads * size != dims[2]:
            return (
                f"the heads and head size {entries[2:]} of the target of Reshape "
                f"{reshape.name!r} are not constants that split {dims[2]}"
            )
        if not _keeps_axes(reshape, source, range(2), proof):
            return (
                f"cannot show that Reshape {reshape.name!r} keeps the batch and sequence "
                f"dimensions of {source.name!r} ({dims[:2]})"
            )
        if found is not None and found != (heads, size):
            return f"Reshape {reshape.name!r} splits into {(heads, size)} heads, not {found}"
        found = (heads, size)
    assert found is not None
    return found


def merges_heads(
    output: ir.Node, query: ir.Value, heads: tuple[int, int], proof: SizeProof | None
) -> str | None:
    """The final Reshape goes back to [B, S, N * H] with the query's B and S."""
    entries = target_entries(output)
    if isinstance(entries, str):
        return entries
    dims = known_dims(query) or [None, None]
    hidden = heads[0] * heads[1]
    out = known_dims(output.outputs[0]) if proof is None else proven_dims(output.outputs[0], proof)
    last_ok = entries[-1] in (hidden, -1) or (out is not None and out[-1] == hidden)
    if len(entries) != 3 or not last_ok:
        return f"Reshape {output.name!r} does not merge the heads into [B, S, {hidden}]"
    if not _keeps_axes(output, query, range(2), proof):
        return (
            f"cannot show that Reshape {output.name!r} restores the batch and sequence "
            f"dimensions of {query.name!r} ({dims[:2]})"
        )
    return None


def swaps_last_axes(flat: ir.Node, unflat: ir.Node, proof: SizeProof | None) -> str | None:
    """Reshape(Transpose(Reshape(K, [B * N, L, H]), [0, 2, 1]), [B, N, H, L]) is K^T: each
    size of the two Reshapes' outputs proven K's on its axis (by the labels without a
    ``proof``)."""
    values = (flat.inputs[0], flat.outputs[0], unflat.outputs[0])
    ranks = [len(v.shape) if v is not None and v.shape is not None else 0 for v in values]
    if ranks != [4, 3, 4]:
        return f"the shapes around {flat.name!r} and {unflat.name!r} are not known"
    k, flat_dims, out = (
        [proof.size(v, a) for a in range(r)] if proof is not None else known_dims(v)
        for v, r in zip(values, ranks, strict=True)
    )
    want_flat, want_out = k[2:], [k[0], k[1], k[3], k[2]]
    same = all(
        a is not None and a == b
        for a, b in zip(flat_dims[1:] + out, want_flat + want_out, strict=True)
    )
    if not same:
        return (
            f"cannot show that {flat.name!r} .. {unflat.name!r} swaps the last two axes of "
            f"K {k}: shapes {flat_dims} and {out}"
        )
    return None


def reshapes_same_data(reshape: ir.Node) -> str | None:
    """Whether the Reshape of out_t can read MultiHeadAttention's output instead."""
    entries = target_entries(reshape)
    if isinstance(entries, str):
        return entries
    if attribute_value(reshape, "allowzero", 0):
        return None
    if any(e is None or e == 0 for e in entries[2:]):
        return (
            f"Reshape {reshape.name!r} may copy a dimension past the second of its input "
            f"(target {entries}), which merging the heads changes"
        )
    return None


def layout_failure(
    match: Match, params: Any, reshape: ir.Node | None, proof: SizeProof | None = None
) -> str | None:
    """Why the matched reshapes and transposes are not the layout the fused op
    assumes, or None: the Reshape after (when there is one) must move the same data,
    K's flatten/unflatten (``k_flat_node``, ``k_unflat_node``) must swap the last two
    axes. (An identity Reshape of the context is bypassed by the canonical form.)"""
    if reshape is not None and (failure := reshapes_same_data(reshape)) is not None:
        return failure
    if params.k_flat_node is not None and params.k_unflat_node is not None:
        flat, unflat = match.node(params.k_flat_node), match.node(params.k_unflat_node)
        return swaps_last_axes(flat, unflat, proof)
    return None


def merged_layout(
    match: Match,
    params: Any,
    query: ir.Value,
    heads: tuple[int, int],
    proof: SizeProof | None = None,
) -> tuple[bool, float] | str:
    """(whether a Reshape must follow the fused op, the scale) of the matched block, or
    why its layout or scale is not the fused op's. The op's ``[B, S, N * H]`` is
    ``out_t``'s ``[B, S, N, H]`` with the heads merged, so any Reshape of ``out_t`` is the
    same Reshape of it, unless it copies a dimension past the second (a 0 entry without
    allowzero). ``proof``: the sizes' proof (the labels decide without one)."""
    output = match.node(params.output_node)
    reshape_after = merges_heads(output, query, heads, proof) is not None
    failure = layout_failure(match, params, output if reshape_after else None, proof)
    if failure is not None:
        return failure
    scale = matched_scale(match, params)
    return scale if isinstance(scale, str) else (reshape_after, scale)


def matched_scale(match: Match, params: Any) -> float | str:
    """The product of every scale the pattern matched (``scale_node`` on the scores,
    ``q_scale_node`` and ``k_scale_node`` on Q and K), or why not."""
    scale = 1.0
    for name in (params.scale_node, params.q_scale_node, params.k_scale_node):
        if name is None:
            continue
        # input 1 after the commutative swap: Mul(c, scores) is written either way
        factor = scale_factor(match.node(name), match.input(name, 1))
        if isinstance(factor, str):
            return factor
        scale *= factor
    return scale
