"""Rule ``kt_by_reshape``: K^T written ``Reshape(Transpose(Reshape(K, [B*N, L, H]), [0,
2, 1]), [B, N, H, L])`` (dynamo's ``k.transpose(-2, -1)`` where it flattens the heads) is
one Transpose of K (``kt_by_reshapes``).

A Reshape keeps the elements in row-major order, so wherever the flattening keeps K's
``L, H`` last and the split writes back ``B, N, H, L``, the three nodes move K's
elements as ``Transpose(K, [0, 1, 3, 2])`` does: exact, no arithmetic. The sizes are
decided by ``proven_same`` (``fusion_core.sizes``), the labels only where the graph's proof
cannot tell.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s
from autofusion.fusion_core.canonical._layout_nodes import (
    Fresh,
    perm,
    producer,
    reshape,
    sandwich,
    sole_reader,
    take_place,
    transpose,
    typed,
)
from autofusion.fusion_core.sizes import SizeProof, proven_other, proven_same

__all__ = ["kt_by_reshapes"]


def kt_by_reshapes(graph: ir.Graph, fresh: Fresh, mark: str) -> int:
    """``Reshape(Transpose(Reshape(K, [B*N, L, H]), [0, 2, 1]), [B, N, H, L])`` (dynamo's
    ``k.transpose(-2, -1)`` where it flattens the heads) is ``Transpose(K, [0, 1, 3,
    2])``, and with K the head Transpose of a split no one else reads, one
    ``Transpose(split, [0, 2, 3, 1])`` (the K^T of TorchScript's SDPA and of the eager
    attention); how many became one. Each size the swap needs is decided by
    ``proven_same``: the graph's proof first, the labels only where it cannot tell (an
    inference's auto-merge labelled a ``[B*N, H, L]`` split of ``[B, N, L, H]`` as the
    swap's ``[B*N, L, H]``)."""
    proof = SizeProof()  # one walk: the sandwiches of every layer read the same sizes
    done = 0
    for node in list(graph):
        found = _kt(node, proof)
        if found is None:
            merged = _kt_of_repeated(node, graph, fresh, proof)
            if merged is None:
                continue
            new, olds = merged
            swap = transpose(new[-1].outputs[0], [0, 1, 3, 2], fresh)
            take_place(graph, node, [*new, swap], olds, mark, "kt_by_reshape")
            done += 1
            continue
        k, order, olds = found
        swap = transpose(k, order, fresh)
        take_place(graph, node, [swap], olds, mark, "kt_by_reshape")
        done += 1
    return done


def _kt_of_repeated(
    unflat: ir.Node, graph: ir.Graph, fresh: Fresh, proof: SizeProof
) -> tuple[list[ir.Node], list[ir.Node]] | None:
    """The same K^T where the flattening Reshape reads the repeated heads ``[B, KV, G,
    L, H]`` themselves (an optimizer merged repeat_kv's ``[B, N, L, H]`` Reshape into
    it): that Reshape is written back, ``Reshape(x, [0, KV * G, -1, H])`` (H read from
    x's Shape), and its swap is K^T. ``KV`` and ``G`` numbers no size the graph proves
    contradicts; the flattening keeping ``L, H`` last and the split writing back ``B,
    KV * G, H, L`` decided by ``proven_same`` (an auto-merge of ``H`` and ``L`` labels
    a ``[B * KV * G, H, L]`` reinterpretation as the flattening). (The new nodes, the
    nodes they replace) or None."""
    found = sandwich(unflat, [0, 2, 1], (5, 3))
    if found is None:
        return None
    flat, swap, kd, _, out = found
    k, last = flat.inputs[0], unflat.outputs[0]
    kv, group = kd[1], kd[2]
    if not isinstance(kv, int) or not isinstance(group, int) or len(out) != 4:
        return None
    numbers = [((k, 1), kv), ((k, 2), group), ((last, 1), kv * group)]
    if out[1] != kv * group or any(proven_other(proof, at, n) for at, n in numbers):
        return None
    pairs = [((flat.outputs[0], 1), (k, 3)), ((flat.outputs[0], 2), (k, 4))]
    pairs += [((last, 0), (k, 0)), ((last, 2), (k, 4)), ((last, 3), (k, 3))]
    if not proven_same(proof, *pairs):
        return None
    size = ir.Node("", "Shape", [k], [ir.AttrInt64("start", 4)], name=fresh("kt_by_reshape_Shape"))
    typed(size, [1], ir.DataType.INT64, fresh, "head_size")
    lead = int64s(graph, fresh, [0, kv * group, -1])
    target = ir.Node(
        "",
        "Concat",
        [lead, size.outputs[0]],
        [ir.AttrInt64("axis", 0)],
        name=fresh("kt_by_reshape_Concat"),
    )
    typed(target, [4], ir.DataType.INT64, fresh, "heads_target")
    heads = reshape(k, target.outputs[0], [kd[0], kv * group, kd[3], kd[4]], fresh)
    return [size, target, heads], [swap, flat]


def _kt(unflat: ir.Node, proof: SizeProof) -> tuple[ir.Value, list[int], list[ir.Node]] | None:
    """(the value, the Transpose's perm, the nodes it replaces) where ``unflat`` ends
    ``Reshape(Transpose(Reshape(k, [B*N, L, H]), [0, 2, 1]), [B, N, H, L])``: the
    flattening keeps ``k``'s ``L, H`` last and the split writes back ``B, N, H, L``."""
    found = sandwich(unflat, [0, 2, 1], (4, 3))
    if found is None:
        return None
    flat, swap, *_ = found
    k, last = flat.inputs[0], unflat.outputs[0]
    pairs = [((flat.outputs[0], 1), (k, 2)), ((flat.outputs[0], 2), (k, 3))]
    pairs += [((last, a), (k, b)) for a, b in enumerate([0, 1, 3, 2])]
    if not proven_same(proof, *pairs):
        return None
    heads = producer(k, "Transpose")
    if heads is not None and perm(heads) == [0, 2, 1, 3] and sole_reader(k) is flat:
        return heads.inputs[0], [0, 2, 3, 1], [swap, flat, heads]
    return k, [0, 1, 3, 2], [swap, flat]
