"""Rule ``kt_of_heads``: K^T is the transpose of the key heads, ``Transpose(K, [0, 1, 3,
2])`` of the key ``K: [B, KV, L, H]``, however the exporter wrote it.

TorchScript and dynamo's optimizer write the two as one ``Transpose(split, [0, 2, 3,
1])`` (``key.permute(0, 2, 3, 1)``, or the composition); dynamo without its optimizer,
and every model that rotates or normalizes the key heads in between (ModernBERT's
rotary), keeps two; a decoder's K^T of its cache is the second alone. One spelling, two
Transposes, serves all of them. With ``s = [0, 1, 3, 2]`` (its own inverse),
``Transpose(Transpose(x, q), s) == Transpose(x, q[s])`` for any ``x``, so a K^T written
as one ``Transpose(x, p)`` is::

    Transpose(x, p)  ->  Transpose(Transpose(x, q), [0, 1, 3, 2]),   q = p[s]

exactly, whatever ``x`` holds, for the K^T of attention scores (the second input of a
rank-4 MatMul whose product a Softmax reads). ``p = [0, 2, 3, 1]`` (``q`` the head
layout ``[0, 2, 1, 3]`` of a head split) is split wherever it is K^T. Any other ``p``
only where ``Transpose(x, q)`` is proven to be a key laid out ``[B, KV, L, H]``: ``x`` is
``Transpose(y, r)`` with ``r[q]`` the identity or the head layout, or ScatterNDs write
into such a Transpose (dynamo's ``slice_scatter`` of a key built in place, written on
``Transpose(key, [3, 1, 2, 0])``: eager attention's ``key.transpose(2, 3)`` merged into
the Transpose back gives ``p = [3, 1, 0, 2]``), and the sizes ``y`` has, so laid out,
are the key's (its last the query's head size, the one before it the scores' length). A
transposed product that is not a key keeps its one Transpose.

``transposes_composed`` composes a pair only to the identity or the head layout, so the
``q`` split off here composes with a Transpose before it where that gives a head split,
and never with the swap after it (the swap stays: no ping-pong). What no fusion took is
composed back (``undo_kt_splits``).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import put_back, replace
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims

__all__ = ["RULE", "kt_of_heads", "undo_kt_splits"]

RULE = "kt_of_heads"
_HEADS = [0, 2, 1, 3]
_SWAP = [0, 1, 3, 2]
_DIRECT = [0, 2, 3, 1]
_KEYS = ([0, 1, 2, 3], _HEADS)  # what r[q] may be: the key itself, or its head split
_ONNX = ("", "ai.onnx")
_WALK = 8  # ScatterNDs between the key's Transpose and K^T, at most


def kt_of_heads(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every K^T by one Transpose as the swap of the key heads; how many."""
    done = 0
    for node in list(graph):
        first = _split_perm(node)
        if first is None:
            continue
        source = node.inputs[0]
        heads = ir.Node(
            "", "Transpose", [source], [ir.AttrInt64s("perm", first)],
            name=fresh_name(f"{RULE}_heads"),
        )  # fmt: skip
        swap = ir.Node(
            "", "Transpose", [heads.outputs[0]], [ir.AttrInt64s("perm", _SWAP)],
            name=fresh_name(f"{RULE}_swap"),
        )  # fmt: skip
        dims = list(source.shape) if source.shape is not None else None  # type: ignore[union-attr]
        heads.outputs[0].shape = ir.Shape([dims[p] for p in first]) if dims else None
        heads.outputs[0].name = fresh_name(f"{RULE}_key")
        heads.outputs[0].dtype = source.dtype  # type: ignore[union-attr]
        swap.outputs[0].dtype, swap.outputs[0].shape = node.outputs[0].dtype, node.outputs[0].shape
        swap.outputs[0].name = fresh_name(f"{RULE}_kt")
        replace(graph, node, [heads, swap], mark, RULE)
        done += 1
    return done


def undo_kt_splits(graph: ir.Graph, mark: str) -> int:
    """Compose back into one Transpose each pair this rule wrote that no fusion took."""
    undone = 0
    for swap in [n for n in graph if n.metadata_props.get(mark) == RULE and _perm(n) == _SWAP]:
        heads = swap.inputs[0].producer() if swap.inputs[0] is not None else None
        if heads is None or heads.metadata_props.get(mark) != RULE:
            continue
        first = _perm(heads)
        if first is None or len(first) != len(_SWAP) or heads.inputs[0] is None:
            continue
        if len(heads.outputs[0].uses()) != 1 or heads.outputs[0].is_graph_output():
            continue
        composed = [first[i] for i in _SWAP]
        one = ir.Node("", "Transpose", [heads.inputs[0]], [ir.AttrInt64s("perm", composed)])
        put_back(graph, one, swap, [swap, heads])
        undone += 1
    return undone


def _split_perm(node: ir.Node) -> list[int] | None:
    """``q`` where ``node`` is a K^T to write as ``Transpose(Transpose(x, q), swap)``."""
    perm = _perm(node) if node.op_type == "Transpose" and node.domain in _ONNX else None
    if perm is None or sorted(perm) != _KEYS[0] or perm == _SWAP:
        return None
    scores = _scores_read(node)
    if scores is None:
        return None
    first = [perm[i] for i in _SWAP]
    if perm == _DIRECT or _key_laid_out(node.inputs[0], first, scores):
        return first
    return None


def _scores_read(node: ir.Node) -> ir.Node | None:
    """The (one) score MatMul that reads ``node``'s output as its input 1, else None."""
    out = node.outputs[0]
    if out.is_graph_output() or node.inputs[0] is None or not out.uses():
        return None
    readers = []
    for use in out.uses():
        reader = use.node
        if reader.op_type != "MatMul" or reader.domain not in _ONNX or use.idx != 1:
            return None
        scores = reader.outputs[0]
        if scores.shape is None or len(scores.shape) != 4 or not reads_into_softmax(scores):
            return None
        readers.append(reader)
    return readers[0]


def _key_laid_out(value: ir.Value | None, first: list[int], scores: ir.Node) -> bool:
    """Whether ``Transpose(value, first)`` is a key: ``value`` is ``Transpose(y, r)``
    (after ScatterNDs that write into it, at most ``_WALK``) with ``r[first]`` the
    identity or the head layout, and ``y`` so laid out has the key's sizes."""
    for _ in range(_WALK + 1):
        producer = value.producer() if value is not None else None
        if producer is None or producer.domain not in _ONNX:
            return False
        if producer.op_type == "ScatterND":
            value = producer.inputs[0]
            continue
        if producer.op_type != "Transpose":
            return False
        inner = _perm(producer)
        if inner is None or len(inner) != len(first):
            return False
        composed = [inner[i] for i in first]
        return composed in _KEYS and _key_sizes(producer.inputs[0], composed, scores)
    return False


def _key_sizes(source: ir.Value | None, layout: list[int], scores: ir.Node) -> bool:
    """``Transpose(source, layout)``'s last two sizes are the key's: the scores' length
    and the query's head size (where both are known, they are the same)."""
    dims, query = known_dims(source), known_dims(scores.inputs[0])
    product = known_dims(scores.outputs[0])
    if dims is None or len(dims) != 4 or query is None or product is None:
        return False
    laid = [dims[i] for i in layout]
    wanted = {2: product[-1], 3: query[-1]}
    return all(laid[a] is None or w is None or laid[a] == w for a, w in wanted.items())


def _perm(node: ir.Node) -> list[int] | None:
    perm = attribute_value(node, "perm", None)
    return list(perm) if perm is not None else None
