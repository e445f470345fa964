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
  1, d])`` for one head ``z: [B, 1, S, d]`` a cache's Concat of the length axis forms;
* ``layout(RotaryEmbedding(z)) = Reshape(RotaryEmbedding_3D(Reshape(layout(z), [0, 0,
  N * d]), num_heads=N), [0, 0, N, d])``: each ``(b, n, s)`` row rotated by position
  ``s`` (``transpose_after_rotary``'s identity).

Every step moves the same elements (or rotates the same rows), so the values are
unchanged. An attention's query, key and value heads are rewritten together or not at
all: where some op that formed one of them is none of these (a rotary still written out,
which the rotary pattern fuses first, as Phi's partial one), the rule waits and no head
of that attention changes. The merge/split pair carries ``head_split``'s marks, so
``undo_unused`` takes out a pair no fusion consumed (the parts stay laid out, the same
values); ``heads_of`` reads ``N`` and ``D`` from the split's constant target.

The places an attention reads heads are ``attention_reads``'s (``_attention_reads.py``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._attention_reads import attention_reads
from autofusion.fusion_core.canonical._edits import drop_unread
from autofusion.fusion_core.canonical._head_split import MERGE, SPLIT
from autofusion.fusion_core.canonical._shape_values import known_dims
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value

__all__ = ["RULE", "concat_heads"]

RULE = "concat_heads"
MS_DOMAIN = "com.microsoft"
_ONNX = ("", "ai.onnx")
_HEAD_PERM = [0, 2, 1, 3]
_DEPTH = 12  # ops from the heads back to what they are formed of, at most
_ROTARIES = {(MS_DOMAIN, "RotaryEmbedding"), ("", "RotaryEmbedding")}


def concat_heads(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write the heads formed by a last-axis Concat, Split or Slice of every attention
    as head splits, where each such read of the attention can be laid out; how many."""
    layout = _Layout(fresh_name, mark)
    done = 0
    for reads in attention_reads(graph):
        first, done_before = len(layout.nodes), dict(layout.done)
        laid_out = [_laid_out(layout, reader, index) for reader, index in reads]
        if any(laid is False for laid in laid_out) or not any(laid_out):
            del layout.nodes[first:]  # nothing was inserted: forget what was laid out
            layout.done = done_before
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


def _laid_out(layout: _Layout, reader: ir.Node, index: int) -> ir.Value | bool | None:
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
    if producer is not None and producer.op_type == "Transpose" and _perm(producer) == _HEAD_PERM:
        producer = producer.inputs[0].producer() if producer.inputs[0] is not None else None
        return producer is not None and producer.op_type == "Concat" and _last_axis(producer)
    return producer is not None and _last_axis(producer)


def _last_axis(node: ir.Node) -> bool:
    if node.domain not in _ONNX or not _rank(node.inputs[0], 4):
        return False
    if node.op_type in ("Concat", "Split"):
        return attribute_value(node, "axis", 0) in (3, -1)
    if node.op_type != "Slice" or len(node.inputs) < 4:
        return False
    axes = constant_array(node.inputs[3])
    return axes is not None and axes.reshape(-1).tolist() in ([3], [-1])


class _Layout:
    """``layout(v) = Transpose(v, [0, 2, 1, 3])`` written through the ops that formed
    ``v`` (the module's docstring lists them); the nodes it adds, in order."""

    def __init__(self, fresh_name: Callable[[str], str], mark: str) -> None:
        self.fresh_name, self.mark = fresh_name, mark
        self.nodes: list[ir.Node] = []
        self.done: dict[int, ir.Node] = {}  # id of an op -> its laid-out copy (k and v share)

    def of(self, value: ir.Value | None, depth: int = 0) -> ir.Value | None:
        """``value`` ([B, N, S, d]) laid out as [B, S, N, d], or None."""
        producer = value.producer() if value is not None else None
        dims = known_dims(value)
        if producer is None or dims is None or len(dims) != 4 or depth > _DEPTH:
            return None
        copied = self.done.get(id(producer))
        if copied is not None:
            return copied.outputs[_output_index(producer, value)]
        op = ("" if producer.domain in _ONNX else producer.domain, producer.op_type)
        if op == ("", "Transpose"):
            return producer.inputs[0] if _perm(producer) == _HEAD_PERM else None
        if op in (("", "Concat"), ("", "Split"), ("", "Slice")) and _last_axis(producer):
            return self._cut(producer, value, depth)
        if op == ("", "Expand"):
            return self._expand(producer, dims, depth)
        if op == ("", "Reshape"):
            return self._one_head(producer, dims)
        if op in _ROTARIES:
            return self._rotary(producer, dims, depth)
        if op == ("", "Concat") and attribute_value(producer, "axis", 0) in (2, -2):
            return self._one_head_view(value, dims)
        return None

    def _one_head_view(self, value: ir.Value, dims: list) -> ir.Value | None:
        """One head ``z: [B, 1, S, d]`` a cache's Concat of the length axis appends to:
        ``Transpose(z, [0, 2, 1, 3])`` keeps the elements' order, so it is ``Reshape(z,
        [0, -1, 1, d])``. (Not any one head: a rotary still written out waits for its
        fusion, as above.)"""
        if dims[1] != 1 or not isinstance(dims[3], int):
            return None
        target = _ints(self.fresh_name, [0, -1, 1, dims[3]])
        reshape = self._add("Reshape", [value, target])
        self._like(reshape.outputs[0], value, _swapped(dims))
        return reshape.outputs[0]

    def _cut(self, node: ir.Node, value: ir.Value, depth: int) -> ir.Value | None:
        """The Concat, Split or Slice on the laid-out parts (the last axis stays last)."""
        count = len(node.inputs) if node.op_type == "Concat" else 1
        parts = [self.of(v, depth + 1) for v in node.inputs[:count]]
        if any(p is None for p in parts):
            return None
        inputs = [*parts, *node.inputs[count:]]
        earlier = _same_op(node, inputs) if node.op_type != "Concat" else None
        if earlier is not None:  # k and v cut from one projection in two rounds
            self.done[id(node)] = earlier
            return earlier.outputs[_output_index(node, value)]
        copy = self._add(
            node.op_type,
            inputs,
            [ir.Attr(a.name, a.type, a.value) for a in node.attributes.values()],
            num_outputs=len(node.outputs),
        )
        for old, new in zip(node.outputs, copy.outputs, strict=True):
            self._like(new, old, _swapped(known_dims(old)))
        self.done[id(node)] = copy
        return copy.outputs[_output_index(node, value)]

    def _expand(self, node: ir.Node, dims: list, depth: int) -> ir.Value | None:
        """One head ``[B, 1, S, d]`` broadcast to ``N``, or an Expand to its own shape."""
        before = known_dims(node.inputs[0])
        if before == dims and None not in dims:
            return self.of(node.inputs[0], depth + 1)
        same = before is not None and len(before) == 4 and before[1] == 1
        same = same and isinstance(dims[1], int)
        if not same or any(before[i] is None or before[i] != dims[i] for i in (0, 2, 3)):  # type: ignore[index]
            return None
        one = self.of(node.inputs[0], depth + 1)
        if one is None:
            return None
        target = _ints(self.fresh_name, [1, 1, dims[1], 1])
        expand = self._add("Expand", [one, target])
        self._like(expand.outputs[0], node.outputs[0], _swapped(dims))
        return expand.outputs[0]

    def _one_head(self, node: ir.Node, dims: list) -> ir.Value | None:
        """``Reshape(x, [B, 1, S, d])`` of ``x: [B, S, d]`` is ``Reshape(x, [0, 0, 1, d])``."""
        source = node.inputs[0]
        flat = known_dims(source)
        if flat is None or len(flat) != 3 or dims[1] != 1 or None in (*flat, dims[0], dims[2]):
            return None
        if [dims[0], dims[2], dims[3]] != flat:
            return None
        target = _ints(self.fresh_name, [0, 0, 1, dims[3]])
        reshape = self._add("Reshape", [source, target])
        self._like(reshape.outputs[0], node.outputs[0], _swapped(dims))
        return reshape.outputs[0]

    def _rotary(self, node: ir.Node, dims: list, depth: int) -> ir.Value | None:
        """The fused rotary of ``[B, N, S, d]`` heads as its 3-D form on the merged heads."""
        laid = self.of(node.inputs[0], depth + 1)
        if laid is None or not all(isinstance(d, int) for d in dims[1::2]):
            return None
        heads, size = dims[1], dims[3]
        merged = self.merged(laid)
        kept = [a for a in node.attributes.values() if a.name != "num_heads"]
        attributes = [ir.Attr(a.name, a.type, a.value) for a in kept]
        rows = self._add(
            node.op_type,
            [merged, *node.inputs[1:]],
            [*attributes, ir.AttrInt64("num_heads", heads)],
            domain=node.domain,
        )
        self._like(rows.outputs[0], merged, list(known_dims(merged) or []))
        target = _ints(self.fresh_name, [0, 0, heads, size])
        split = self._add("Reshape", [rows.outputs[0], target])
        self._like(split.outputs[0], node.inputs[0], _swapped(dims))
        return split.outputs[0]

    def merged(self, laid: ir.Value) -> ir.Value:
        """``[B, S, N, d]`` as ``[B, S, N * d]``: the Reshape's source where ``laid`` is a
        Reshape of that, else a new Reshape."""
        dims = known_dims(laid)
        assert dims is not None and isinstance(dims[2], int) and isinstance(dims[3], int)
        producer = laid.producer()
        reshaped = producer is not None and producer.op_type == "Reshape"
        source = producer.inputs[0] if reshaped else None  # type: ignore[union-attr]
        flat = [dims[0], dims[1], dims[2] * dims[3]]
        if source is not None and known_dims(source) == flat and None not in flat:
            return source
        target = _ints(self.fresh_name, [0, 0, flat[2]])
        reshape = self._add("Reshape", [laid, target])
        self._like(reshape.outputs[0], laid, flat)
        return reshape.outputs[0]

    def _add(self, op: str, inputs: list, attributes=(), **kwargs) -> ir.Node:
        node = ir.Node(
            kwargs.pop("domain", ""),
            op,
            inputs,
            list(attributes),
            name=self.fresh_name(f"{RULE}_{op}"),
            **kwargs,
        )
        node.metadata_props[self.mark] = RULE
        self.nodes.append(node)
        return node

    def _like(self, value: ir.Value, like: ir.Value, dims: list) -> None:
        base = (like.name or "heads").split("/")[-1].removeprefix(f"{RULE}_")
        value.name = self.fresh_name(f"{RULE}_{base}")
        value.dtype = like.dtype
        value.shape = ir.Shape(_symbols(like, dims))


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
            [source, _ints(fresh_name, target)],
            name=fresh_name(f"{RULE}_Reshape"),
        )
        reshape.metadata_props[mark] = role
        nodes.append(reshape)
        source = reshape.outputs[0]
        _named(source, laid, shape, fresh_name(f"{RULE}_{role.split(':')[1]}d"))
    transpose = ir.Node(
        "", "Transpose", [source], [ir.AttrInt64s("perm", _HEAD_PERM)], name=fresh_name(RULE)
    )
    transpose.metadata_props[mark] = RULE
    _named(transpose.outputs[0], laid, dims, fresh_name(f"{RULE}_heads"))
    return [*nodes, transpose]


def _ints(fresh_name: Callable[[str], str], values: list[int]) -> ir.Value:
    """An int64 constant, registered as an initializer when its reader is inserted."""
    value = ir.Value(
        name=fresh_name(f"{RULE}_ints"),
        shape=ir.Shape([len(values)]),
        const_value=ir.tensor(np.array(values, np.int64)),
    )
    value.dtype = ir.DataType.INT64
    return value


def _named(value: ir.Value, like: ir.Value, dims: list, name: str) -> None:
    value.name, value.dtype = name, like.dtype
    value.shape = ir.Shape(_symbols(like, dims))


def _symbols(like: ir.Value, dims: list) -> list:
    """``dims`` with each symbol name as the SymbolicDim ``like`` (or any value) has."""
    found = {}
    if like.shape is not None:
        found = {d.value: d for d in like.shape if not isinstance(d, int) and d.value}
    return [found.get(d, ir.SymbolicDim(d)) if isinstance(d, str) or d is None else d for d in dims]


def _same_op(node: ir.Node, inputs: list) -> ir.Node | None:
    """A node already in the graph that computes what a copy of ``node`` reading
    ``inputs`` would: same op, same inputs, same attributes."""
    attributes = {name: a.value for name, a in node.attributes.items()}
    for use in inputs[0].uses():
        other = use.node
        if other.op_type != node.op_type or other.domain != node.domain or other.graph is None:
            continue
        same_inputs = len(other.inputs) == len(inputs) and all(
            a is b for a, b in zip(other.inputs, inputs, strict=True)
        )
        mine = {name: a.value for name, a in other.attributes.items()}
        if same_inputs and mine == attributes and len(other.outputs) == len(node.outputs):
            return other
    return None


def _swapped(dims: list | None) -> list:
    if dims is None or len(dims) != 4:
        return [None] * 4
    return [dims[0], dims[2], dims[1], dims[3]]


def _output_index(node: ir.Node, value: ir.Value | None) -> int:
    return next(i for i, out in enumerate(node.outputs) if out is value)


def _perm(node: ir.Node) -> list[int] | None:
    perm = attribute_value(node, "perm", None)
    return list(perm) if perm is not None else None


def _rank(value: ir.Value | None, rank: int) -> bool:
    return value is not None and value.shape is not None and len(value.shape) == rank
