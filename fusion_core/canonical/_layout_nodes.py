"""The nodes the sequence-first layout rules read and write (``_sequence_first.py``,
``_kt_by_reshape.py``): a producer of one op, a node's sole reader, a Transpose's perm,
``Reshape(Transpose(Reshape(x), perm))`` sandwiches, and new Transposes and Reshapes
with their outputs typed and named."""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import replace
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import Dim, known_dims

__all__ = ["Fresh", "perm", "producer", "reshape", "sandwich", "sole_reader", "take_place"]
__all__ += ["transpose", "typed"]

Fresh = Callable[[str], str]


def sole_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    if len(uses) != 1 or value.is_graph_output():
        return None
    return uses[0].node


def producer(value: ir.Value | None, op: str) -> ir.Node | None:
    node = value.producer() if value is not None else None
    if node is None or node.op_type != op or node.domain not in ("", "ai.onnx"):
        return None
    return node


def perm(node: ir.Node | None) -> list[int] | None:
    if node is None:
        return None
    found = attribute_value(node, "perm", None)
    return list(found) if found is not None else None


def typed(node: ir.Node, dims: list[Dim] | None, dtype, fresh: Fresh, hint: str) -> ir.Value:
    """``node``'s output, named, of ``dtype`` and of ``dims`` where all are known."""
    out = node.outputs[0]
    out.name = fresh(hint)
    out.dtype = dtype
    out.shape = ir.Shape(dims) if dims is not None and None not in dims else None
    return out


def transpose(source: ir.Value, order: list[int], fresh: Fresh) -> ir.Node:
    node = ir.Node("", "Transpose", [source], [ir.AttrInt64s("perm", order)])
    node.name = fresh("sequence_first_Transpose")
    dims = known_dims(source)
    typed(node, [dims[p] for p in order] if dims else None, source.dtype, fresh, "batch_first")
    return node


def reshape(source: ir.Value, target: ir.Value, dims, fresh: Fresh) -> ir.Node:
    node = ir.Node("", "Reshape", [source, target], name=fresh("sequence_first_Reshape"))
    typed(node, dims, source.dtype, fresh, "batch_first_reshaped")
    return node


def sandwich(last: ir.Node, order: list[int], ranks: tuple[int, int]):
    """(first Reshape, Transpose, dims of its input, of the first Reshape's output, of
    ``last``'s output) of ``last = Reshape(Transpose(Reshape(x), order))``, each node
    read by the next alone, ``last``'s output no graph output, x and the first Reshape's
    output of ``ranks`` with known shapes; else None."""
    if last.op_type != "Reshape" or last.outputs[0].is_graph_output():
        return None
    swap = producer(last.inputs[0], "Transpose")
    first = producer(swap.inputs[0] if swap else None, "Reshape")
    if first is None or perm(swap) != order:
        return None
    if sole_reader(first.outputs[0]) is not swap or sole_reader(swap.outputs[0]) is not last:
        return None
    dims = [known_dims(v) for v in (first.inputs[0], first.outputs[0], last.outputs[0])]
    if any(d is None for d in dims) or (len(dims[0]), len(dims[1])) != ranks:
        return None
    return first, swap, *dims


def take_place(
    graph: ir.Graph, node: ir.Node, new: list[ir.Node], olds: list[ir.Node], mark: str, rule: str
) -> None:
    """``new`` in ``node``'s place (``_edits.replace``), then ``olds``, which only fed
    ``node``, go (readers first)."""
    replace(graph, node, new, mark, rule)
    for old in olds:
        graph.remove(old, safe=True)
