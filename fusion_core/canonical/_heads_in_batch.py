"""Rule ``heads_in_batch``: attention computed over heads folded into the batch (``[B * N,
S, H]``, ``bmm``: XGLM, BART-era and other older exports) is computed over ``[B, N, S,
H]``, the layout the attention patterns read.

Such graphs fold the heads into the batch before each product and unfold them after::

    merge(x) = Reshape(x, [B * N, S, H])       of x: [B, N, S, H]
    split(y) = Reshape(y, [B, N, S, L])        of y: [B * N, S, L]

Every op between a merge and a split that acts on each leading index alone (a batched
MatMul, a Softmax over the last axis) gives the same elements when applied to the
unmerged values, so::

    split(MatMul(merge(a), merge(b)))            ->  MatMul(a, b)
    split(MatMul(merge(a), Transpose(merge(b), [0, 2, 1])))
                                                 ->  MatMul(a, Transpose(b, [0, 1, 3, 2]))
    Softmax(merge(x), axis=-1)                   ->  merge(Softmax(x, axis=-1))

exactly. A merge is proven from the shapes: rank 4 to rank 3 with the last two
dimensions known and equal, so the first is the product of the two leading ones; a
split the other way round, to the very shape the product has unmerged.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import by_op_type, replace
from autofusion.fusion_core.canonical._shape_values import known_dims
from autofusion.fusion_core.patterns import attribute_value

__all__ = ["RULE", "heads_unfolded"]

RULE = "heads_in_batch"
_ONNX = ("", "ai.onnx")


def heads_unfolded(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Unfold every batched Softmax of a merge, and every batched MatMul of merges that a
    split reads; how many."""
    return by_op_type(
        graph,
        {
            "Softmax": lambda node: _softmax(graph, node, fresh_name, mark),
            "Reshape": lambda node: _split_matmul(graph, node, fresh_name, mark),
        },
    )


def _split_matmul(graph: ir.Graph, split: ir.Node, fresh_name, mark: str) -> int:
    inner = split.inputs[0].producer() if split.inputs[0] is not None else None
    if inner is None or inner.op_type != "MatMul" or inner.domain not in _ONNX:
        return 0
    if split.outputs[0].is_graph_output():
        return 0
    if len(split.inputs[0].uses()) != 1:  # type: ignore[union-attr]
        return 0
    new = _matmul(inner, known_dims(split.outputs[0]))
    if new is None:
        return 0
    _named(new, fresh_name)
    out = new[-1].outputs[0]
    out.dtype, out.shape = split.outputs[0].dtype, split.outputs[0].shape
    merges = [v.producer() for v in inner.inputs if v is not None]
    replace(graph, split, new, mark, RULE)
    graph.remove(inner, safe=True)
    _drop_unread(graph, merges)
    return 1


def _softmax(graph: ir.Graph, node: ir.Node, fresh_name, mark: str) -> int:
    """``Softmax(Reshape(x, t), -1)`` of a merge is ``Reshape(Softmax(x, -1), t)``."""
    x = _unmerged(node.inputs[0])
    if x is None or attribute_value(node, "axis", -1) not in (-1, 2):
        return 0
    if node.outputs[0].is_graph_output():
        return 0
    merge = node.inputs[0].producer()  # type: ignore[union-attr]
    softmax = ir.Node("", "Softmax", [x], [ir.AttrInt64("axis", -1)])
    again = ir.Node("", "Reshape", [softmax.outputs[0], merge.inputs[1]])  # type: ignore[union-attr]
    softmax.outputs[0].dtype, softmax.outputs[0].shape = x.dtype, x.shape
    again.outputs[0].dtype, again.outputs[0].shape = node.outputs[0].dtype, node.outputs[0].shape
    _named([softmax, again], fresh_name)
    replace(graph, node, [softmax, again], mark, RULE)
    _drop_unread(graph, [merge])
    return 1


def _named(nodes: list[ir.Node], fresh_name) -> None:
    for node in nodes:
        node.name = fresh_name(f"{RULE}_{node.op_type}")
        node.outputs[0].name = fresh_name(f"{RULE}_{node.op_type.lower()}")


def _matmul(node: ir.Node, want: list | None) -> list[ir.Node] | None:
    a, b = (_unmerged(v) for v in node.inputs[:2])
    swapped = None
    if b is None:  # K^T: Transpose(merge(k), [0, 2, 1])
        transpose = node.inputs[1].producer() if node.inputs[1] is not None else None
        if (
            transpose is not None
            and transpose.op_type == "Transpose"
            and list(attribute_value(transpose, "perm", []) or []) == [0, 2, 1]
        ):
            swapped = _unmerged(transpose.inputs[0])
    if a is None or (b is None and swapped is None):
        return None
    da = known_dims(a)
    db = known_dims(b if b is not None else swapped)
    if da is None or db is None or None in da or None in db or da[:2] != db[:2]:
        return None  # unknown leading dimensions prove no fold (nor which unfold)
    last = db[3] if b is not None else db[2]
    if want != [*da[:3], last]:
        return None
    nodes = []
    if swapped is not None:
        turn = ir.Node("", "Transpose", [swapped], [ir.AttrInt64s("perm", [0, 1, 3, 2])])
        turn.outputs[0].dtype = swapped.dtype
        turn.outputs[0].shape = ir.Shape([swapped.shape[i] for i in (0, 1, 3, 2)])  # type: ignore[index]
        nodes.append(turn)
        b = turn.outputs[0]
    nodes.append(ir.Node("", "MatMul", [a, b]))
    return nodes


def _unmerged(value: ir.Value | None) -> ir.Value | None:
    """``x`` where ``value = Reshape(x, [B * N, S, H])`` of a ``[B, N, S, H]`` x (the
    last two dimensions known and kept), else None."""
    merge = value.producer() if value is not None else None
    if merge is None or not _is_reshape(merge) or merge.inputs[0] is None:
        return None
    source = merge.inputs[0]
    before, after = known_dims(source), known_dims(value)
    if before is None or after is None or len(before) != 4 or len(after) != 3:
        return None
    if None in before[2:] or before[2:] != after[1:]:
        return None
    return source


def _is_reshape(node: ir.Node) -> bool:
    return node.op_type == "Reshape" and node.domain in _ONNX


def _drop_unread(graph: ir.Graph, nodes: list[ir.Node | None]) -> None:
    """Remove the merges (and a K^T's Transpose of one) the rewrite left unread."""
    pending = [n for n in nodes if n is not None]
    while pending:
        node = pending.pop()
        if node.graph is not graph or node.op_type not in ("Reshape", "Transpose"):
            continue
        if any(o.uses() or o.is_graph_output() for o in node.outputs):
            continue
        source = node.inputs[0].producer() if node.inputs[0] is not None else None
        graph.remove(node, safe=True)
        if source is not None:
            pending.append(source)
