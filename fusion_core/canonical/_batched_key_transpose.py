"""Rule ``kt_of_folded_heads``: K^T written over the heads folded into the batch, a
Reshape, a Transpose of the last two axes and a Reshape back, is one ``Transpose(k, [0,
1, 3, 2])``, proven from the two Reshapes' own targets.

torch.export writes eager attention's ``key.transpose(2, 3)`` so where it flattens the
heads to run the transpose as a 3-D one (MiniMax-M3's decode step: the key repeated by
repeat_kv, its targets Concats of Slices of the key's Shape)::

    m = Reshape(k, [B * N, L, H])         k: [B, N, L, H]
    t = Transpose(m, [0, 2, 1])           [B * N, H, L]
    Reshape(t, [B, N, H, L])              ->  Transpose(k, [0, 1, 3, 2])

A Reshape keeps the elements in row-major order, so ``m[b * N + n, l, h] = k[b, n, l,
h]`` wherever the first target's last two entries are ``k``'s own last two sizes (its
first is then ``B * N``, by the element count, whatever it says); ``t[b * N + n, h, l]
= k[b, n, l, h]``; and the second Reshape gives ``out[b, n, h, l] = t[b * N + n, h, l]``
wherever its target is ``[B, N, H, L]``: its last two entries ``H`` and ``L``, and its
second ``N`` (or its first ``B`` and its second -1: the element count makes it ``N``).
So the three are the swap exactly, bit for bit: no arithmetic, the same elements moved.

Each entry is proven by ``fusion_core.sizes`` from the graph (a constant, a read of a
Shape, a 0 that copies the Reshape's own input size there), never from a shape an
inference put on the values: onnxruntime's symbolic inference merges symbols it cannot
compare, so a merge of other axes (``[-1, N, H]``, ``B * L`` rows) can carry the labels
of the right one. ``kt_by_reshape`` (``_kt_by_reshape.py``), which runs first, reads the
inferred dimensions; this rule takes what they do not prove (the decode graph for any
number of new tokens, whose targets read the key's Shape).

Nothing to undo: the one Transpose computes the same elements as the three nodes it
replaces (its readers see the same values), with one copy instead of a copy and two
views, so it stays where no fusion took it, as ``kt_by_reshape``'s does. The attention
pattern reads it as K^T of the key (the swap of ``kt_of_heads``' canonical spelling).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread, replace
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import Size, SizeProof

__all__ = ["RULE", "kt_of_folded_heads"]

RULE = "kt_of_folded_heads"
_ONNX = ("", "ai.onnx")
_SWAP = [0, 1, 3, 2]
_COPY, _REST = Size((), 0), Size((), -1)  # a target's 0 (allowzero 0) and -1


def kt_of_folded_heads(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every proven merge -> Transpose([0, 2, 1]) -> split of a rank-4 value as
    its swap ``Transpose(k, [0, 1, 3, 2])``; how many."""
    proof = SizeProof()  # one walk: the targets of every layer read the same sizes
    done = 0
    for node in list(graph):
        if node.graph is not graph:
            continue
        found = _folded_swap(node, proof)
        if found is None:
            continue
        key, olds = found
        swap = ir.Node(
            "", "Transpose", [key], [ir.AttrInt64s("perm", _SWAP)], name=fresh_name(f"{RULE}_swap")
        )
        out = swap.outputs[0]
        out.name, out.dtype = fresh_name(f"{RULE}_kt"), key.dtype
        out.shape = ir.Shape([key.shape[i] for i in _SWAP]) if key.shape else None  # type: ignore[index]
        replace(graph, node, [swap], mark, RULE)
        drop_unread(graph, olds)
        done += 1
    return done


def _folded_swap(split: ir.Node, proof: SizeProof) -> tuple[ir.Value, list[ir.Node]] | None:
    """(``k``, the Transpose and the merge) where ``split`` is ``Reshape(Transpose(
    Reshape(k, t1), [0, 2, 1]), t2)`` with both targets proven (module docstring); else
    None."""
    if not _is(split, "Reshape") or split.outputs[0].is_graph_output():
        return None
    turn = _producer(split.inputs[0], "Transpose")
    merge = _producer(turn.inputs[0] if turn is not None else None, "Reshape")
    if merge is None or list(attribute_value(turn, "perm", []) or []) != [0, 2, 1]:
        return None
    key, folded = merge.inputs[0], merge.outputs[0]
    if key is None or _rank(key) != 4 or _rank(folded) != 3 or _rank(split.outputs[0]) != 4:
        return None
    sizes = [proof.size(key, axis) for axis in range(4)]
    if None in sizes or not _merges_leading(merge, sizes, proof):
        return None
    if not _splits_back(split, sizes, proof):
        return None
    return key, [turn, merge]  # type: ignore[list-item]


def _merges_leading(merge: ir.Node, sizes: list[Size | None], proof: SizeProof) -> bool:
    """The merge's target ends in ``k``'s own last two sizes ``L, H``: its rows are then
    ``B * N`` (the element count), in ``k``'s order."""
    entries = _target(merge, proof)
    return entries is not None and len(entries) == 3 and entries[1:] == sizes[2:]


def _splits_back(split: ir.Node, sizes: list[Size | None], proof: SizeProof) -> bool:
    """The split's target is ``[B, N, H, L]`` of ``k: [B, N, L, H]``: its last two entries
    ``H, L``, and ``N`` second (or ``B`` first and -1 second: the count makes it ``N``).
    A 0 entry copies the Transpose's size there (``_target``)."""
    entries = _target(split, proof)
    if entries is None or len(entries) != 4 or entries[2:] != [sizes[3], sizes[2]]:
        return False
    lead, heads = entries[:2]
    if heads == sizes[1]:
        return lead in (sizes[0], _REST)
    return (lead, heads) == (sizes[0], _REST)


def _target(reshape: ir.Node, proof: SizeProof) -> list[Size | None] | None:
    """The Reshape's target entries as sizes, each 0 that copies (allowzero 0) read as
    its input's proven size on that axis; None where the target is not read."""
    if len(reshape.inputs) < 2:
        return None
    entries = proof.entries(reshape.inputs[1])
    if entries is None:
        return None
    if attribute_value(reshape, "allowzero", 0):
        return list(entries)
    data = reshape.inputs[0]
    return [proof.size(data, i) if e == _COPY else e for i, e in enumerate(entries)]


def _producer(value: ir.Value | None, op: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    return node if node is not None and _is(node, op) else None


def _is(node: ir.Node, op: str) -> bool:
    return node.op_type == op and node.domain in _ONNX


def _rank(value: ir.Value) -> int | None:
    return len(value.shape) if value.shape is not None else None
