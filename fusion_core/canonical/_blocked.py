"""Rule ``blocked_projection``: q, k and v cut from one projection laid out in
model-parallel blocks, as projections of their own.

CodeGen computes q, k and v with one Linear whose output is ``mp`` blocks, each holding a
part of q, of v and of k side by side: ``qkv.reshape(B, S, mp, 3 * c)`` split on the last
axis. So q is not a contiguous slice of the projection, and its head split
``Reshape(q, [B, S, N, H])`` reads a 4-D value, not the ``[B, S, N * H]`` projection the
rotary and attention patterns read. But each output column of a MatMul is computed from
its own weight column, so::

    Split(Reshape(x @ W, [B, S, mp, w]), axis=-1)[j]
      == Reshape(x @ W[:, cols_j], [0, 0, mp, c_j])
    cols_j = [b * w + o_j + t  for b < mp, t < c_j]       (o_j: the part's offset)

and a head split ``Reshape(part_j, [B, S, N, H])`` reads ``x @ W[:, cols_j]`` directly
(a Reshape only renumbers elements; its target copies at most B and S, which both have).
Each part is then a projection of its own, which the Q/K/V merge may take back as one
MatMul and a Split of contiguous parts. The same products, summed over the same inputs:
no value changes. No undo: the merge is the way back.
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import by_op_type, int64s, replace
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import entries, known_dims

__all__ = ["RULE", "blocked_projections"]

RULE = "blocked_projection"
_ONNX = ("", "ai.onnx")


def blocked_projections(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Rewrite every last-axis Split of a blocked projection; how many."""
    return by_op_type(graph, {"Split": lambda node: _unblock(graph, node, fresh_name, mark)})


def _unblock(graph: ir.Graph, split: ir.Node, fresh_name, mark: str) -> int:
    found = _blocked(split)
    if found is None:
        return 0
    matmul, blocks, width, sizes = found
    x, weight = matmul.inputs[0], constant_array(matmul.inputs[1])
    assert x is not None and weight is not None
    products, parts = [], []
    offset = 0
    for j, size in enumerate(sizes):
        cols = [b * width + offset + t for b in range(blocks) for t in range(size)]
        offset += size
        part_weight = ir.Value(
            name=fresh_name(f"{RULE}_weight"), const_value=ir.tensor(weight[:, cols].copy())
        )
        part_weight.dtype = matmul.inputs[1].dtype  # type: ignore[union-attr]
        part_weight.shape = ir.Shape([weight.shape[0], len(cols)])
        product = ir.Node("", "MatMul", [x, part_weight], name=fresh_name(f"{RULE}_MatMul"))
        dims = list(x.shape or [])  # type: ignore[arg-type]
        product.outputs[0].shape = ir.Shape([*dims[:-1], len(cols)]) if dims else None
        target = int64s(graph, fresh_name, [0, 0, blocks, size])
        part = ir.Node("", "Reshape", [product.outputs[0], target], name=fresh_name(RULE))
        part.outputs[0].shape = split.outputs[j].shape
        for node in (product, part):
            node.outputs[0].dtype = split.outputs[j].dtype
            node.outputs[0].name = fresh_name(f"{RULE}_{node.op_type.lower()}")
        products.append(product)
        parts.append(part)
    view = split.inputs[0].producer()  # type: ignore[union-attr]
    replace(graph, split, [*products, *parts], mark, RULE)
    graph.remove([view, matmul], safe=True)  # type: ignore[list-item]
    for product, part in zip(products, parts, strict=True):
        _head_splits_read_the_product(graph, part, product)
    return 1


def _head_splits_read_the_product(graph: ir.Graph, part: ir.Node, product: ir.Node) -> None:
    """A Reshape of ``part`` whose target copies nothing past B and S reads the 3-D
    product instead; ``part`` goes when nothing else reads it."""
    for use in list(part.outputs[0].uses()):
        reader = use.node
        target = entries(reader.inputs[1]) if reader.op_type == "Reshape" else None
        if target is None or use.idx != 0 or reader.domain not in _ONNX:
            continue
        if 0 in target[2:] and not attribute_value(reader, "allowzero", 0):
            continue  # a 0 past the second entry copies a dimension the product lacks
        reader.replace_input_with(0, product.outputs[0])
    if not part.outputs[0].uses() and not part.outputs[0].is_graph_output():
        graph.remove(part, safe=True)


def _blocked(split: ir.Node) -> tuple[ir.Node, int, int, list[int]] | None:
    """(the MatMul, the blocks, each block's width, the parts' sizes) where ``split`` cuts
    the last axis of ``Reshape(x @ W, [B, S, blocks, width])`` with more than one block,
    W a constant ``[hidden, blocks * width]``, each value read only by the next; None
    otherwise."""
    if split.domain not in _ONNX or any(o.is_graph_output() for o in split.outputs):
        return None
    view = split.inputs[0].producer() if split.inputs[0] is not None else None
    if view is None or view.op_type != "Reshape" or view.domain not in _ONNX:
        return None
    matmul = view.inputs[0].producer() if view.inputs[0] is not None else None
    if matmul is None or matmul.op_type != "MatMul" or matmul.domain not in _ONNX:
        return None
    for value in (view.outputs[0], matmul.outputs[0]):
        if len(value.uses()) != 1 or value.is_graph_output():
            return None
    weight = constant_array(matmul.inputs[1])
    flat, blocked = known_dims(matmul.outputs[0]), known_dims(view.outputs[0])
    if weight is None or weight.ndim != 2 or flat is None or blocked is None:
        return None
    if len(flat) != 3 or len(blocked) != 4 or attribute_value(split, "axis", 0) not in (3, -1):
        return None
    blocks, width = blocked[2], blocked[3]
    if not isinstance(blocks, int) or not isinstance(width, int) or blocks < 2:
        return None
    # the view splits the last axis only: B and S stay, blocks * width is the projection
    if None in flat[:2] or blocked[:2] != flat[:2] or blocks * width != weight.shape[1]:
        return None
    sizes = _sizes(split, width)
    return None if sizes is None else (matmul, blocks, width, sizes)


def _sizes(split: ir.Node, width: int) -> list[int] | None:
    """The Split's part sizes along an axis of ``width``: from its ``split`` input or
    attribute, or equal parts."""
    count = len(split.outputs)
    given = attribute_value(split, "split", None)
    if given is None and len(split.inputs) > 1 and split.inputs[1] is not None:
        array = constant_array(split.inputs[1])
        given = None if array is None else [int(a) for a in array.reshape(-1)]
        if given is None:
            return None
    if given is None:
        if width % count:
            return None
        given = [width // count] * count
    sizes = [int(s) for s in given]
    if len(sizes) != count or sum(sizes) != width or min(sizes) <= 0:
        return None
    return sizes
