"""The sequence lengths GroupQueryAttention takes: ``seqlens_k``, ``total_sequence_length``
and ``query_seqlens``, read with ``Shape`` from a graph input proven to have the size
(``graph_input_with_dim``), else from the query or the key itself, and shared by the
layers whose sizes are proven the same sizes of the graph's inputs.

Never by a label alone: onnxruntime's symbolic inference labelled Kimi-Linear's padded
length ``sequence`` like the input's unpadded one, and a ``total_sequence_length`` read
from that input would be shorter than the keys.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.rewriters._base import RewriteContext
from autofusion.fusion_core.rewriters._shared import mark_shared, shared_value
from autofusion.fusion_core.rewriters.group_query_attention._inputs import KVSide
from autofusion.fusion_core.rewriters.group_query_attention._proven import Past
from autofusion.fusion_core.sizes import Size, SizeProof

__all__ = ["graph_input_with_dim", "lengths_of"]


def lengths_of(
    q: ir.Value, key: KVSide, ctx: RewriteContext, nodes: list[ir.Node], past: Past
) -> list[ir.Value]:
    """``seqlens_k`` ([B] int32: every key row is valid, L - 1), ``total_sequence_length``
    (scalar int32 L) and ``query_seqlens`` ([B] int32 S), L = past length + S; shared
    by the layers whose batch, sequence and past sizes are proven the same sizes of the
    graph's inputs (``past``: ``P`` and the proof)."""
    sizes = (past.proof.size(q, 0), past.proof.size(key.new, 1), past.length)
    shared_key = "gqa_lengths:" + ":".join(_spelled(s) for s in sizes) if _declared(sizes) else None
    if shared_key is not None:
        found = [shared_value(ctx.graph, f"{shared_key}:{i}") for i in range(3)]
        if all(v is not None for v in found):
            return found  # type: ignore[return-value]
    values, from_inputs = _lengths(q, key, ctx, nodes, past.proof)
    if shared_key is not None and from_inputs:
        for i, value in enumerate(values):
            producer = value.producer()
            assert producer is not None
            mark_shared(producer, f"{shared_key}:{i}")
    return values


def _spelled(size: Size | None) -> str:
    return "+".join([*size.atoms, str(size.constant)]) if size is not None else "?"


def _declared(sizes: tuple[Size | None, ...]) -> bool:
    """Whether every size is proven and made of the graph inputs' dimensions (no inner
    value's own size: ``sizes.own``, named by an identity that other runs do not share)."""
    return all(s is not None and not any(a.startswith("@") for a in s.atoms) for s in sizes)


def _lengths(
    q: ir.Value, key: KVSide, ctx: RewriteContext, nodes: list[ir.Node], proof: SizeProof
) -> tuple[list[ir.Value], bool]:
    """The three lengths, and whether every size was read from a graph input.

    Only then may other layers share them: read from this layer's query or key, a layer
    above that fused later would wait for this one's input (SmolLM3, whose NoPE layer
    fuses a round before the layers with a rotary embedding: a cycle)."""
    read_from_inputs = []

    def shape(value: ir.Value, start: int) -> ir.Value:
        value, start = graph_input_with_dim(ctx.graph, value, start, proof)
        read_from_inputs.append(value.is_graph_input())
        attrs = [ir.AttrInt64("start", start), ir.AttrInt64("end", start + 1)]
        nodes.append(ir.Node("", "Shape", [value], attrs))
        return nodes[-1].outputs[0]

    def add(op: str, inputs: list[ir.Value | None], attrs: list[ir.Attr] = ()) -> ir.Value:
        nodes.append(ir.Node("", op, inputs, list(attrs)))
        return nodes[-1].outputs[0]

    def to_int32(value: ir.Value) -> ir.Value:
        return add("Cast", [value], [ir.AttrInt64("to", ir.DataType.INT32)])

    sequence = shape(key.new, 1)
    total = sequence if key.past is None else add("Add", [shape(key.past, 2), sequence])
    batch = shape(q, 0)
    one = ctx.initializer("gqa_one", np.array([1], np.int64))
    scalar_shape = ctx.initializer("gqa_scalar_shape", np.array([], np.int64))
    seqlens = add("Expand", [to_int32(add("Sub", [total, one])), batch])
    total_length = to_int32(add("Reshape", [total, scalar_shape]))
    query_seqlens = add("Expand", [to_int32(sequence), batch])
    for value in (seqlens, total_length, query_seqlens):
        value.dtype = ir.DataType.INT32
    return [seqlens, total_length, query_seqlens], all(read_from_inputs)


def graph_input_with_dim(
    graph: ir.Graph, value: ir.Value, axis: int, proof: SizeProof
) -> tuple[ir.Value, int]:
    """A graph input and axis proven to have ``value``'s size at ``axis`` (a declared
    dimension the graph ties to it, through an earlier fusion's rotary or norm), else
    ``value`` and ``axis`` themselves: never by a label alone (one label may name a
    padded and an unpadded length)."""
    if value.is_graph_input() or value.shape is None or axis >= len(value.shape):
        return value, axis
    size = proof.size(value, axis)
    if size is None or size.value is not None:
        return value, axis
    for source in graph.inputs:
        for index in range(len(source.shape or ())):
            if proof.size(source, index) == size:
                return source, index
    return value, axis
