"""``layout(v) = Transpose(v, [0, 2, 1, 3])`` of heads ``v: [B, N, S, d]`` written through
the ops that formed ``v``, for rule ``concat_heads`` (``_concat_heads.py``, whose
docstring has the identities): ``HeadsLayout.of(v)`` is ``v`` laid out as ``[B, S, N,
d]``, or None where some op that formed it is none the rule moves through.

One head (``N == 1``) is laid out whatever formed it: ``Transpose(z, [0, 2, 1, 3])`` of
``z: [B, 1, S, d]`` keeps the elements in their order, so it is ``Reshape(z, [0, -1, 1,
d])``. The ops that formed it are tried first (so a one-head rotary of a ``[B, S, d]``
projection rotates the projection, as before); where they cannot be laid out (Dots3's
shared key part, ``view(B, 1, S, r)``, normed by an RMSNorm and rotated by a rotary still
written out in its interleaved spelling), what they added is forgotten and the one head
is viewed. A one head inside one being laid out is never viewed on its own, so one view
serves the whole part.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims

__all__ = ["HEAD_PERM", "HeadsLayout", "ints", "last_axis", "perm_of", "symbols"]

RULE = "concat_heads"
MS_DOMAIN = "com.microsoft"
HEAD_PERM = [0, 2, 1, 3]
_ONNX = ("", "ai.onnx")
_DEPTH = 12  # ops from the heads back to what they are formed of, at most
_ROTARIES = {(MS_DOMAIN, "RotaryEmbedding"), ("", "RotaryEmbedding")}


class HeadsLayout:
    """``layout(v)`` written through the ops that formed ``v``; the nodes it adds, in
    order."""

    def __init__(self, fresh_name: Callable[[str], str], mark: str) -> None:
        self.fresh_name, self.mark = fresh_name, mark
        self.nodes: list[ir.Node] = []
        self.done: dict[int, ir.Node] = {}  # id of an op -> its laid-out copy (k and v share)
        self._in_one_head = False  # laying out the parts of one head: no view of its own

    def of(self, value: ir.Value | None, depth: int = 0) -> ir.Value | None:
        """``value`` ([B, N, S, d]) laid out as [B, S, N, d], or None."""
        producer = value.producer() if value is not None else None
        dims = known_dims(value)
        if producer is None or dims is None or len(dims) != 4 or depth > _DEPTH:
            return None
        copied = self.done.get(id(producer))
        if copied is not None:
            return copied.outputs[_output_index(producer, value)]
        if dims[1] == 1 and not self._in_one_head:
            return self._one_head(producer, value, dims, depth)  # type: ignore[arg-type]
        return self._formed(producer, value, dims, depth)  # type: ignore[arg-type]

    def _formed(
        self, producer: ir.Node, value: ir.Value, dims: list, depth: int
    ) -> ir.Value | None:
        """``value`` laid out through ``producer``, one of the ops the rule moves through."""
        op = ("" if producer.domain in _ONNX else producer.domain, producer.op_type)
        if op == ("", "Transpose"):
            return producer.inputs[0] if perm_of(producer) == HEAD_PERM else None
        if op in (("", "Concat"), ("", "Split"), ("", "Slice")) and last_axis(producer):
            return self._cut(producer, value, depth)
        if op == ("", "Expand"):
            return self._expand(producer, dims, depth)
        if op == ("", "Reshape"):
            return self._reshaped_head(producer, dims)
        if op in _ROTARIES:
            return self._rotary(producer, dims, depth)
        if op == ("", "Concat") and attribute_value(producer, "axis", 0) in (2, -2):
            return self._one_head_view(value, dims)
        return None

    def _one_head(
        self, producer: ir.Node, value: ir.Value, dims: list, depth: int
    ) -> ir.Value | None:
        """One head laid out through the ops that formed it, else viewed (the module's
        docstring); the nodes a failed try added are forgotten."""
        first, done = len(self.nodes), dict(self.done)
        self._in_one_head = True
        try:
            laid = self._formed(producer, value, dims, depth)
        finally:
            self._in_one_head = False
        if laid is not None:
            return laid
        self.forget(first, done)
        return self._one_head_view(value, dims)

    def forget(self, first: int, done: dict[int, ir.Node]) -> None:
        """Drop the nodes added from ``first`` on, never inserted, and what they read
        (a node reads its inputs from the moment it is made: left so, it would keep what
        it read from ever counting as unread), and go back to the copies ``done``."""
        for node in self.nodes[first:]:
            for index in range(len(node.inputs)):
                node.replace_input_with(index, None)
        del self.nodes[first:]
        self.done = done

    def _one_head_view(self, value: ir.Value, dims: list) -> ir.Value | None:
        """One head ``z: [B, 1, S, d]`` (formed by ops no rule lays out, or a cache's
        Concat of the length axis appends to): ``Transpose(z, [0, 2, 1, 3])`` keeps the
        elements' order, so it is ``Reshape(z, [0, -1, 1, d])``."""
        if dims[1] != 1 or not isinstance(dims[3], int):
            return None
        target = ints(self.fresh_name, [0, -1, 1, dims[3]])
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
        target = ints(self.fresh_name, [1, 1, dims[1], 1])
        expand = self._add("Expand", [one, target])
        self._like(expand.outputs[0], node.outputs[0], _swapped(dims))
        return expand.outputs[0]

    def _reshaped_head(self, node: ir.Node, dims: list) -> ir.Value | None:
        """``Reshape(x, [B, 1, S, d])`` of ``x: [B, S, d]`` is ``Reshape(x, [0, 0, 1, d])``."""
        source = node.inputs[0]
        flat = known_dims(source)
        if flat is None or len(flat) != 3 or dims[1] != 1 or None in (*flat, dims[0], dims[2]):
            return None
        if [dims[0], dims[2], dims[3]] != flat:
            return None
        target = ints(self.fresh_name, [0, 0, 1, dims[3]])
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
        target = ints(self.fresh_name, [0, 0, heads, size])
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
        target = ints(self.fresh_name, [0, 0, flat[2]])
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
        value.shape = ir.Shape(symbols(like, dims))


def last_axis(node: ir.Node) -> bool:
    """A Concat, Split or Slice (constant axes) of the last axis of a rank-4 value."""
    if node.domain not in _ONNX or not _rank(node.inputs[0], 4):
        return False
    if node.op_type in ("Concat", "Split"):
        return attribute_value(node, "axis", 0) in (3, -1)
    if node.op_type != "Slice" or len(node.inputs) < 4:
        return False
    axes = constant_array(node.inputs[3])
    return axes is not None and axes.reshape(-1).tolist() in ([3], [-1])


def ints(fresh_name: Callable[[str], str], values: list[int]) -> ir.Value:
    """An int64 constant, registered as an initializer when its reader is inserted."""
    value = ir.Value(
        name=fresh_name(f"{RULE}_ints"),
        shape=ir.Shape([len(values)]),
        const_value=ir.tensor(np.array(values, np.int64)),
    )
    value.dtype = ir.DataType.INT64
    return value


def symbols(like: ir.Value, dims: list) -> list:
    """``dims`` with each symbol name as the SymbolicDim ``like`` (or any value) has."""
    found = {}
    if like.shape is not None:
        found = {d.value: d for d in like.shape if not isinstance(d, int) and d.value}
    return [found.get(d, ir.SymbolicDim(d)) if isinstance(d, str) or d is None else d for d in dims]


def perm_of(node: ir.Node) -> list[int] | None:
    perm = attribute_value(node, "perm", None)
    return list(perm) if perm is not None else None


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


def _rank(value: ir.Value | None, rank: int) -> bool:
    return value is not None and value.shape is not None and len(value.shape) == rank
