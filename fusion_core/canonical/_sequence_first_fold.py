"""Rule ``sequence_first_fold``: heads folded into the batch straight from a
sequence-first layout read as a fold of batch-first heads, the spelling
``heads_in_batch`` computes per head.

``F.multi_head_attention_forward(..., need_weights=True)`` (WavLM: its gated position
bias as ``attn_mask``; both torch exporters) takes the bmm path, not SDPA: for q, k, v
``x: [S, B, E]`` with ``E = N * H`` it folds the heads straight into the batch::

    fold(x)  = Transpose(Reshape(x, [S, B * N, H]), [1, 0, 2])        [B * N, S, H]
    foldT(x) = Transpose(Reshape(x, [S, B * N, H]), [1, 2, 0])        [B * N, H, S]

and merges the context ``c: [B * N, S, H]`` back for out_proj as
``Reshape(Transpose(c, [1, 0, 2]), [S * B, E])``. A Reshape keeps the row-major order,
so ``fold(x)[b * N + n, s, h] = x[s, b, n * H + h] = heads(x)[b, n, s, h]`` with
``heads(x) = Transpose(Reshape(Transpose(x, [1, 0, 2]), [0, 0, N, H]), [0, 2, 1, 3])``
(``sequence_first_heads``' batch-first split), and the context's element ``(s, m, h)``
is the ``(s * M + m) * H + h``-th either way it is merged; so, exactly (the same
elements moved)::

    fold(x)   ->  Reshape(heads(x), [-1, S, H])
    foldT(x)  ->  Transpose(Reshape(heads(x), [-1, S, H]), [0, 2, 1])
    Reshape(Transpose(c, [1, 0, 2]), t)
              ->  Reshape(Transpose(Reshape(c, [-1, N, S, H]), [2, 0, 1, 3]), t)

the merges' ``S, H`` read from the heads' (the context's) own Shape, so
``fusion_core.sizes`` proves them. The context is split only where it is a product
whose values are such a merge of ``N`` heads (its rows then ``B * N``) and ``t`` ends
in ``E``; the fold only where the Reshape keeps ``S`` first and ends in ``H``, decided
by ``proven_same`` (the graph's proof, labels where it cannot tell), ``E`` and ``H``
numbers no size the graph proves contradicts. What is left is ``heads_in_batch``'s
folded attention and ``sequence_first_merge``'s merge.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s
from autofusion.fusion_core.canonical._layout_nodes import (
    Fresh,
    perm,
    producer,
    reshape,
    sole_reader,
    take_place,
    transpose,
    typed,
)
from autofusion.fusion_core.sizes import SizeProof, known_dims, proven_other, proven_same

__all__ = ["RULE", "sequence_first_folds"]

RULE = "sequence_first_fold"
_FOLDS = {(1, 0, 2): False, (1, 2, 0): True}  # the perm: whether it is K^T


def sequence_first_folds(graph: ir.Graph, fresh: Fresh, mark: str) -> int:
    """Write every fold of sequence-first heads, then every merge of a context of such
    folds, as those of batch-first heads; how many."""
    proof = SizeProof()  # one walk: the folds of every layer read the same sizes
    done = 0
    for node in list(graph):
        found = _fold(node, proof)
        if found is not None:
            _write_fold(graph, node, *found, fresh, mark)
            done += 1
    for node in list(graph):
        found = _context(node, proof)
        if found is not None:
            _write_context(graph, node, *found, fresh, mark)
            done += 1
    return done


def _fold(swap: ir.Node, proof: SizeProof) -> tuple[ir.Node, int, int] | None:
    """(the Reshape, N, H) where ``swap`` is ``fold`` or ``foldT`` of ``x: [S, B, E]``."""
    order = perm(swap) if swap.op_type == "Transpose" else None
    if order is None or tuple(order) not in _FOLDS or swap.outputs[0].is_graph_output():
        return None
    flat = producer(swap.inputs[0], "Reshape")
    if flat is None or sole_reader(flat.outputs[0]) is not swap or not _bmm(swap.outputs[0]):
        return None
    x, folded = flat.inputs[0], flat.outputs[0]
    xd, fd = known_dims(x), known_dims(folded)
    if xd is None or fd is None or len(xd) != 3 or len(fd) != 3:
        return None
    width, size = xd[2], fd[2]
    if not isinstance(width, int) or not isinstance(size, int) or size <= 0 or width % size:
        return None
    if any(proven_other(proof, at, n) for at, n in [((x, 2), width), ((folded, 2), size)]):
        return None
    if not proven_same(proof, ((folded, 0), (x, 0))):
        return None  # S kept first and H last: the element count makes the rest B * N
    return flat, width // size, size


def _bmm(fold: ir.Value) -> bool:
    """Whether a batched MatMul reads ``fold``, perhaps through a scale (Mul or Div): the
    bmm path. (nn.MultiheadAttention's SDPA path splits the fold ``[B, N, S, H]`` by a
    Reshape, ``sequence_first_heads``.)"""
    reader = sole_reader(fold)
    if reader is not None and reader.op_type in ("Mul", "Div"):
        reader = sole_reader(reader.outputs[0])
    return reader is not None and reader.op_type == "MatMul"


def _write_fold(graph, swap: ir.Node, flat: ir.Node, heads: int, size: int, fresh, mark) -> None:
    x = flat.inputs[0]
    xd = known_dims(x)
    assert xd is not None
    early = transpose(x, [1, 0, 2], fresh)
    target = int64s(graph, fresh, [0, 0, heads, size])
    split = reshape(early.outputs[0], target, [xd[1], xd[0], heads, size], fresh)
    late = transpose(split.outputs[0], [0, 2, 1, 3], fresh)
    new = [early, split, late, *_merged(graph, late.outputs[0], fresh)]
    fd = known_dims(flat.outputs[0]) or [None] * 3
    new[-1].outputs[0].shape = ir.Shape([fd[1], fd[0], fd[2]])  # the fold's [B * N, S, H]
    if _FOLDS[tuple(perm(swap) or ())]:
        new.append(transpose(new[-1].outputs[0], [0, 2, 1], fresh))
    take_place(graph, swap, new, [flat], mark, RULE)


def _merged(graph: ir.Graph, heads: ir.Value, fresh: Fresh) -> list[ir.Node]:
    """``Reshape(heads, Concat([-1], Shape(heads, start=2)))``: ``[B * N, S, H]``."""
    shape, target = _kept_axes(graph, heads, 2, [-1], fresh, ("heads_size", "fold_target"))
    merge = reshape(heads, target.outputs[0], None, fresh)
    return [shape, target, merge]


def _kept_axes(
    graph: ir.Graph, value: ir.Value, start: int, lead: list[int], fresh: Fresh, names
) -> tuple[ir.Node, ir.Node]:
    """``Shape(value, start)`` and the Reshape target ``Concat(lead, it)``: the last two
    axes of ``value`` kept as they are, ``lead`` before them."""
    shape = ir.Node(
        "", "Shape", [value], [ir.AttrInt64("start", start)], name=fresh(f"{RULE}_Shape")
    )
    typed(shape, [2], ir.DataType.INT64, fresh, names[0])
    target = ir.Node(
        "",
        "Concat",
        [int64s(graph, fresh, lead), shape.outputs[0]],
        [ir.AttrInt64("axis", 0)],
        name=fresh(f"{RULE}_Concat"),
    )
    typed(target, [len(lead) + 2], ir.DataType.INT64, fresh, names[1])
    return shape, target


def _context(merge: ir.Node, proof: SizeProof) -> tuple[ir.Node, int, int] | None:
    """(the Transpose, N, H) where ``merge`` is ``Reshape(Transpose(c, [1, 0, 2]), t)``
    of a context ``c = MatMul(p, v)`` with ``v`` a merge of ``[B, N, S, H]`` heads and
    ``t`` ending in ``E = N * H``."""
    swap = producer(merge.inputs[0], "Transpose") if merge.op_type == "Reshape" else None
    if swap is None or perm(swap) != [1, 0, 2] or sole_reader(swap.outputs[0]) is not merge:
        return None
    context = swap.inputs[0]
    product = producer(context, "MatMul")
    values = producer(product.inputs[1], "Reshape") if product is not None else None
    if values is None or merge.outputs[0].is_graph_output():
        return None
    cd, md, vd = known_dims(context), known_dims(merge.outputs[0]), known_dims(values.inputs[0])
    if cd is None or md is None or vd is None or (len(cd), len(md), len(vd)) != (3, 2, 4):
        return None
    width, heads, size = md[1], vd[1], cd[2]
    if not all(isinstance(n, int) for n in (width, heads, size)) or width != heads * size:
        return None
    numbers = [((merge.outputs[0], 1), width), ((values.inputs[0], 1), heads)]
    if any(proven_other(proof, at, n) for at, n in numbers):
        return None
    kept = [((values.outputs[0], 1), (values.inputs[0], 2))]
    kept += [((values.outputs[0], 2), (values.inputs[0], 3)), ((context, 2), (values.inputs[0], 3))]
    if not proven_same(proof, *kept):
        return None  # v's rows B * N by the element count, so the context's
    return swap, heads, size  # type: ignore[return-value]


def _write_context(
    graph, merge: ir.Node, swap: ir.Node, heads: int, size: int, fresh, mark
) -> None:
    context = swap.inputs[0]
    assert context is not None
    shape, target = _kept_axes(
        graph, context, 1, [-1, heads], fresh, ("context_size", "context_target")
    )
    cd = known_dims(context) or [None, None, None]
    product = context.producer()
    assert product is not None and product.inputs[1] is not None
    values = product.inputs[1].producer()
    batch = (known_dims(values.inputs[0]) if values is not None else None) or [None]
    split = reshape(context, target.outputs[0], None, fresh)
    split.outputs[0].shape = ir.Shape([batch[0], heads, cd[1], size])  # the values' B
    turned = transpose(split.outputs[0], [2, 0, 1, 3], fresh)
    again = ir.Node(
        "", "Reshape", [turned.outputs[0], merge.inputs[1]], name=fresh(f"{RULE}_Reshape")
    )
    zero = merge.attributes.get("allowzero")
    if zero is not None:  # the target's own entries: as they were
        again.attributes["allowzero"] = ir.AttrInt64("allowzero", int(zero.value))
    typed(again, known_dims(merge.outputs[0]), merge.outputs[0].dtype, fresh, "context_rows")
    take_place(graph, merge, [shape, target, split, turned, again], [swap], mark, RULE)
