"""Rule ``kt_of_heads``: K^T is the transpose of the key heads, ``Transpose(K, [0, 1, 3,
2])`` of ``K = Transpose(split, [0, 2, 1, 3])``, however the exporter wrote it.

TorchScript and dynamo's optimizer write the two as one ``Transpose(split, [0, 2, 3,
1])`` (``key.permute(0, 2, 3, 1)``, or the composition); dynamo without its optimizer,
and every model that rotates or normalizes the key heads in between (ModernBERT's
rotary), keeps two; a decoder's K^T of its cache is the second alone. One spelling, two
Transposes, serves all of them::

    Transpose(x, [0, 2, 3, 1])  ->  Transpose(Transpose(x, [0, 2, 1, 3]), [0, 1, 3, 2])

exactly, for the K^T of attention scores (the second input of a rank-4 MatMul whose
product a Softmax reads). What no fusion took is composed back (``undo_kt_splits``).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import put_back, replace
from autofusion.fusion_core.canonical._scales import reads_into_softmax
from autofusion.fusion_core.patterns import attribute_value

__all__ = ["RULE", "kt_of_heads", "undo_kt_splits"]

RULE = "kt_of_heads"
_HEADS = [0, 2, 1, 3]
_SWAP = [0, 1, 3, 2]
_DIRECT = [0, 2, 3, 1]
_ONNX = ("", "ai.onnx")


def kt_of_heads(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every K^T by one Transpose as the swap of the key heads; how many."""
    done = 0
    for node in list(graph):
        if not _direct_kt(node):
            continue
        source = node.inputs[0]
        heads = ir.Node(
            "", "Transpose", [source], [ir.AttrInt64s("perm", _HEADS)],
            name=fresh_name(f"{RULE}_heads"),
        )  # fmt: skip
        swap = ir.Node(
            "", "Transpose", [heads.outputs[0]], [ir.AttrInt64s("perm", _SWAP)],
            name=fresh_name(f"{RULE}_swap"),
        )  # fmt: skip
        dims = list(source.shape) if source.shape is not None else None  # type: ignore[union-attr]
        heads.outputs[0].shape = ir.Shape([dims[p] for p in _HEADS]) if dims else None
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
        if heads is None or heads.metadata_props.get(mark) != RULE or _perm(heads) != _HEADS:
            continue
        if len(heads.outputs[0].uses()) != 1 or heads.outputs[0].is_graph_output():
            continue
        one = ir.Node("", "Transpose", [heads.inputs[0]], [ir.AttrInt64s("perm", _DIRECT)])
        put_back(graph, one, swap, [swap, heads])
        undone += 1
    return undone


def _direct_kt(node: ir.Node) -> bool:
    if node.op_type != "Transpose" or node.domain not in _ONNX or _perm(node) != _DIRECT:
        return False
    out = node.outputs[0]
    if out.is_graph_output() or node.inputs[0] is None:
        return False
    for use in out.uses():
        reader = use.node
        if reader.op_type != "MatMul" or reader.domain not in _ONNX or use.idx != 1:
            return False
        scores = reader.outputs[0]
        if scores.shape is None or len(scores.shape) != 4 or not reads_into_softmax(scores):
            return False
    return bool(out.uses())


def _perm(node: ir.Node) -> list[int] | None:
    perm = attribute_value(node, "perm", None)
    return list(perm) if perm is not None else None
