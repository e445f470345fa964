"""Rule ``concat_heads``: query, key or value heads the attention reads as a Concat (or a
Split or Slice) of the last axis of ``[B, N, S, *]`` parts become a head split.

Multi-head latent attention (DeepSeek-V2/V3, MiniCPM3) forms each query and key head
from two parts, ``q = cat(q_nope, rot(q_pe))`` and ``k = cat(k_nope, rot(k_pe))`` with
``k_pe`` one head shared by all (expanded to ``N``), and cuts ``k_nope`` and ``v`` from
one projection by a Split of the transposed heads; ``v``'s head size is its own. The
attention patterns read heads as ``Transpose(Reshape(x, [B, S, N, D]), [0, 2, 1, 3])``
of a ``[B, S, N * D]`` projection ``x``. With ``p = [0, 2, 1, 3]`` (its own inverse)::

    X == Transpose(Reshape(Reshape(Y, [0, 0, N * D]), [0, 0, N, D]), p),  Y = Transpose(X, p)

for any ``X: [B, N, S, D]``, and ``Y`` is written without a Transpose by moving ``p``
through the ops that formed ``X`` (``layout(v)`` below is ``Transpose(v, p)``):

* ``layout(Transpose(y, p)) = y``;
* ``layout(Concat(a, b, axis=-1)) = Concat(layout(a), layout(b), axis=-1)``, and the same
  for a Split or Slice of the last axis (``p`` keeps the last axis last);
* ``layout(Expand(z, [B, N, S, d])) = Expand(layout(z), [1, 1, N, 1])`` for one head
  ``z: [B, 1, S, d]`` (only the heads axis broadcast);
* ``layout(Reshape(x, [B, 1, S, d])) = Reshape(x, [0, 0, 1, d])`` for ``x: [B, S, d]``
  (one head: the same elements in the same order), and ``layout(z) = Reshape(z, [0, -1,
  1, d])`` for any one head ``z: [B, 1, S, d]`` no step here lays out (a cache's Concat
  of the length axis; Dots3's shared key part, normed and rotated by a rotary still
  written out);
* ``layout(RotaryEmbedding(z)) = Reshape(RotaryEmbedding_3D(Reshape(layout(z), [0, 0,
  N * d]), num_heads=N), [0, 0, N, d])``: each ``(b, n, s)`` row rotated by position
  ``s`` (``transpose_after_rotary``'s identity).

Every step moves the same elements (or rotates the same rows), so the values are
unchanged. An attention's query, key and value heads are rewritten together or not at
all: where some op that formed one of them is none of these (a rotary of ``N > 1`` heads
still written out, which the rotary pattern fuses first, as Phi's partial one or Dots3's
query before its fusion), the rule waits and no head of that attention changes. The
merge/split pair carries ``head_split``'s marks, so ``undo_unused`` takes out a pair no
fusion consumed (the parts stay laid out, the same values); ``heads_of`` reads ``N`` and
``D`` from the split's constant target.

The places an attention reads heads are ``attention_reads``'s (``_attention_reads.py``);
the layout is ``HeadsLayout`` (``_heads_layout.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._attention_reads import attention_reads
from autofusion.fusion_core.canonical._edits import drop_unread
from autofusion.fusion_core.canonical._head_split import MERGE, SPLIT
from autofusion.fusion_core.canonical._heads_layout import (
    HEAD_PERM,
    HeadsLayout,
    ints,
    last_axis,
    perm_of,
    symbols,
)
from autofusion.fusion_core.sizes import known_dims

__all__ = ["RULE", "concat_heads"]

RULE = "concat_heads"


def concat_heads(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write the heads formed by a last-axis Concat, Split or Slice of every attention
    as head splits, where each such read of the attention can be laid out; how many."""
    layout = HeadsLayout(fresh_name, mark)
    done = 0
    for reads in attention_reads(graph):
        first, done_before = len(layout.nodes), dict(layout.done)
        laid_out = [_laid_out(layout, reader, index) for reader, index in reads]
        if any(laid is False for laid in laid_out) or not any(laid_out):
            layout.forget(first, done_before)  # nothing was inserted
            continue
        for (reader, index), laid in zip(reads, laid_out, strict=True):
            if not laid:
                continue  # a head split already, or heads of another spelling
            heads = reader.inputs[index]
            layout.nodes += _head_split(laid, known_dims(heads), fresh_name, mark)  # type: ignore[arg-type]
            old = heads.producer()  # type: ignore[union-attr]
            reader.replace_input_with(index, layout.nodes[-1].outputs[0])
            drop_unread(graph, [old])
            done += 1
        _insert(graph, reads[0][0], layout.nodes[first:])
    if done:
        graph.sort()  # the nodes went before the score MatMul: some serve K^T, before it
    return done


def _laid_out(layout: HeadsLayout, reader: ir.Node, index: int) -> ir.Value | bool | None:
    """The heads ``reader`` reads laid out as [B, S, N, D]; None where they are not
    formed by parts (nothing to do), False where they are and cannot be laid out."""
    heads = reader.inputs[index]
    if heads is None or not _formed_by_parts(heads):
        return None
    dims = known_dims(heads)
    if dims is None or len(dims) != 4 or not all(isinstance(d, int) for d in dims[1::2]):
        return False
    if heads.is_graph_output():
        return False
    laid = layout.of(heads)
    return False if laid is None else laid


def _insert(graph: ir.Graph, before: ir.Node, nodes: list[ir.Node]) -> None:
    """Put ``nodes`` before ``before``; the constants they read become initializers."""
    for node in nodes:
        for value in node.inputs:
            constant = value is not None and value.const_value is not None
            if constant and value.producer() is None and value.name not in graph.initializers:
                graph.register_initializer(value)
    graph.insert_before(before, nodes)


def _formed_by_parts(heads: ir.Value) -> bool:
    """A last-axis Concat, Split or Slice, or the head Transpose of a last-axis Concat."""
    producer = heads.producer()
    if producer is not None and producer.op_type == "Transpose" and perm_of(producer) == HEAD_PERM:
        producer = producer.inputs[0].producer() if producer.inputs[0] is not None else None
        return producer is not None and producer.op_type == "Concat" and last_axis(producer)
    return producer is not None and last_axis(producer)


def _head_split(
    laid: ir.Value, dims: list, fresh_name: Callable[[str], str], mark: str
) -> list[ir.Node]:
    """``Transpose(Reshape(Reshape(laid, [0, 0, N * D]), [0, 0, N, D]), [0, 2, 1, 3])``:
    the merge/split pair marked as ``head_split``'s, and the head Transpose."""
    heads, size = dims[1], dims[3]
    batch, sequence = dims[0], dims[2]
    nodes = []
    source = laid
    for role, target, shape in (
        (MERGE, [0, 0, heads * size], [batch, sequence, heads * size]),
        (SPLIT, [0, 0, heads, size], [batch, sequence, heads, size]),
    ):
        reshape = ir.Node(
            "",
            "Reshape",
            [source, ints(fresh_name, target)],
            name=fresh_name(f"{RULE}_Reshape"),
        )
        reshape.metadata_props[mark] = role
        nodes.append(reshape)
        source = reshape.outputs[0]
        _named(source, laid, shape, fresh_name(f"{RULE}_{role.split(':')[1]}d"))
    transpose = ir.Node(
        "", "Transpose", [source], [ir.AttrInt64s("perm", HEAD_PERM)], name=fresh_name(RULE)
    )
    transpose.metadata_props[mark] = RULE
    _named(transpose.outputs[0], laid, dims, fresh_name(f"{RULE}_heads"))
    return [*nodes, transpose]


def _named(value: ir.Value, like: ir.Value, dims: list, name: str) -> None:
    value.name, value.dtype = name, like.dtype
    value.shape = ir.Shape(symbols(like, dims))
