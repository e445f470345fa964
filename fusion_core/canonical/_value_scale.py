"""Rule ``value_scale``: values scaled by a constant after their head split
(MiMo-V2-Flash's ``v_proj(x).view(..).transpose(1, 2) * v_scale``) are the head split of
the projection so scaled.

An elementwise op with a constant commutes with the head split when the constant is
laid out as the split lays out the channels::

    Transpose(Reshape(x, [B, S, KV, Hv]), [0, 2, 1, 3]) * c
        == Transpose(Reshape(x * c', [B, S, KV, Hv]), [0, 2, 1, 3])

``c`` one number, one per head (``[1, KV, 1, 1]``), one per channel (``[Hv]``) or one
per head and channel (``[1, KV, 1, Hv]``; ``[1, 1, KV, Hv]`` on ``[B, S, KV, Hv]``
before the Transpose), and ``c'`` its ``[KV * Hv]`` flattening (``c'[kv * Hv + h] =
c[kv, h]``; one number stays one). Every output element is the same product (or
quotient: ``Div(v, c)``) of the same two numbers, so the value is exact, bit for bit,
and the cost the same: one elementwise op over the same elements. The scale of the
values then sits on the ``[B, S, KV * Hv]`` tensor an attention op takes as its value
(GroupQueryAttention, MultiHeadAttention), and the head split is the plain one the
attention pattern reads.

The values are found from the attention's context ``P @ V``: its ``V`` through the
repeat of repeat_kv and a KV cache's ``Concat(past, new)`` (the scale on the new values
alone: what ``cache.update`` stores is scaled, as the past is), then the scale ops, then
the head split. Only values read by that chain alone move (each step's output read by
the next only), so no other reader sees scaled values. This is not the context form
``(P @ V) * c``, which would round once more and cannot reach a cache whose past is
scaled already, nor a fold into ``v_proj``'s weights, which rounds differently.

``undo_value_scales`` writes the scale after the head Transpose again (``c`` as ``[1,
KV, 1, Hv]``, one number as one) where the head split is still there and nothing but
it reads the scaled projection: no attention fusion took it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._contexts import is_context
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims

__all__ = ["RULE", "undo_value_scales", "value_scales"]

RULE = "value_scale"
_ONNX = ("", "ai.onnx")
_HEAD_PERM = [0, 2, 1, 3]
Fresh = Callable[[str], str]


@dataclass(frozen=True)
class _Scale:
    """One scale op of the values: the node, the side of its constant, the constant as
    ``[KV, Hv]`` (a 0-d array where it is one number)."""

    node: ir.Node
    side: int
    grid: np.ndarray


@dataclass(frozen=True)
class _ScaledValues:
    """A head split ``Transpose(Reshape(x))`` and the scale ops around its Transpose (in
    data-flow order): ``between`` on ``[B, S, KV, Hv]``, ``after`` on ``[B, KV, S, Hv]``."""

    reshape: ir.Node
    transpose: ir.Node
    between: list[_Scale]
    after: list[_Scale]


def value_scales(graph: ir.Graph, fresh_name: Fresh, mark: str) -> int:
    """Move the constant scales of every attention's values before their head split;
    how many attentions."""
    done = 0
    for node in list(graph):
        if node.graph is not graph or not is_context(node) or len(node.inputs) != 2:
            continue
        found = _scaled_values(node.inputs[1])
        if found is not None:
            _move_before_split(graph, found, fresh_name, mark)
            done += 1
    return done


def _is(node: ir.Node | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in _ONNX


def _only_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0].node if len(uses) == 1 and not value.is_graph_output() else None


def _new_values(value: ir.Value) -> ir.Value:
    """The value heads before repeat_kv's ``Reshape(Expand(Unsqueeze(v, 2)))`` and the
    new ones of a cache's ``Concat(past, new, axis=2)``, where the graph has them."""
    steps = [value.producer()]
    for _ in range(2):  # the Expand, then the Unsqueeze
        last = steps[-1]
        steps.append(last.inputs[0].producer() if last is not None and last.inputs else None)  # type: ignore[union-attr]
    repeat, expand, unsqueeze = steps
    if _is(repeat, "Reshape") and _is(expand, "Expand") and _is(unsqueeze, "Unsqueeze"):
        value = unsqueeze.inputs[0] or value  # type: ignore[union-attr]
    cache = value.producer()
    appends = _is(cache, "Concat") and len(cache.inputs) == 2  # type: ignore[union-attr]
    if appends and attribute_value(cache, "axis", 0) in (2, -2) and cache.inputs[1] is not None:  # type: ignore[arg-type,union-attr]
        value = cache.inputs[1]  # type: ignore[union-attr,assignment]
    return value


def _scales_into(value: ir.Value) -> tuple[list[ir.Node], ir.Value]:
    """The chain of Mul/Div ops with a constant that ends in ``value`` (data-flow order)
    and the value it starts from; each op but the last read by the next alone."""
    ops: list[ir.Node] = []
    while (op := value.producer()) is not None and op.op_type in ("Mul", "Div"):
        if op.domain not in _ONNX or len(op.inputs) != 2 or None in op.inputs:
            break
        if ops and _only_reader(value) is not ops[0]:
            break
        sides = [i for i, v in enumerate(op.inputs) if v.const_value is not None]  # type: ignore[union-attr]
        if len(sides) != 1 or (op.op_type == "Div" and sides[0] != 1):
            break  # c / v is no scale
        ops.insert(0, op)
        value = op.inputs[1 - sides[0]]  # type: ignore[assignment]
    return ops, value


def _grid(op: ir.Node, heads: tuple[int, int], *, after: bool) -> _Scale | None:
    """The scale op's constant as ``[KV, Hv]`` (one number as a 0-d array), or None where
    it varies with the batch or the sequence or would grow its data."""
    side = 0 if op.inputs[0].const_value is not None else 1  # type: ignore[union-attr]
    array = op.inputs[side].const_value.numpy()  # type: ignore[union-attr]
    if array.ndim > 4:
        return None
    padded = array.reshape((1,) * (4 - array.ndim) + array.shape)
    free = (0, 2) if after else (0, 1)  # the batch and sequence axes where it stands
    if any(padded.shape[i] != 1 for i in free):
        return None
    grid = padded[0, :, 0, :] if after else padded[0, 0]
    if any(d not in (1, want) for d, want in zip(grid.shape, heads, strict=True)):
        return None
    flat = np.broadcast_to(grid, heads)
    same = flat.size and np.all(flat == flat.reshape(-1)[0])
    return _Scale(op, side, flat.reshape(-1)[0].copy() if same else np.ascontiguousarray(flat))


def _scaled_values(value: ir.Value) -> _ScaledValues | None:
    """The head split of the values ``value`` (a context's ``V``) and the constant scales
    around its Transpose, or None where there are none or they cannot move."""
    after, source = _scales_into(_new_values(value))
    transpose = source.producer()
    if not _is(transpose, "Transpose"):
        return None
    if list(attribute_value(transpose, "perm", []) or []) != _HEAD_PERM:  # type: ignore[arg-type]
        return None
    if after and _only_reader(source) is not after[0]:
        return None
    between, split = _scales_into(transpose.inputs[0])  # type: ignore[union-attr,arg-type]
    reshape = split.producer()
    if not (after or between) or not _is(reshape, "Reshape"):
        return None
    if _only_reader(split) is not (between[0] if between else transpose):
        return None
    if between and _only_reader(transpose.inputs[0]) is not transpose:  # type: ignore[union-attr,arg-type]
        return None
    heads = _heads(reshape)  # type: ignore[arg-type]
    if heads is None or any(o.outputs[0].is_graph_output() for o in after + between):
        return None
    scales = [_grid(op, heads, after=True) for op in after]
    early = [_grid(op, heads, after=False) for op in between]
    if None in scales or None in early:
        return None
    return _ScaledValues(reshape, transpose, early, scales)  # type: ignore[arg-type]


def _heads(reshape: ir.Node) -> tuple[int, int] | None:
    """(KV, Hv) of a Reshape of ``[B, S, KV * Hv]`` into ``[B, S, KV, Hv]``."""
    source, split = known_dims(reshape.inputs[0]), known_dims(reshape.outputs[0])
    if source is None or split is None or len(source) != 3 or len(split) != 4:
        return None
    heads, size = split[2], split[3]
    if not isinstance(heads, int) or not isinstance(size, int) or source[2] != heads * size:
        return None
    return heads, size


def _move_before_split(graph: ir.Graph, found: _ScaledValues, fresh_name: Fresh, mark: str) -> None:
    """The scale ops, in order, on the projection before the Reshape; the head split
    takes the readers of the last one."""
    x, value, made = found.reshape.inputs[0], found.reshape.inputs[0], []
    for scale in [*found.between, *found.after]:
        array = scale.grid if scale.grid.ndim == 0 else scale.grid.reshape(-1)
        constant = _initializer(graph, fresh_name(f"{RULE}_c"), array)
        inputs = [value, constant] if scale.side == 1 else [constant, value]
        node = ir.Node(
            "", scale.node.op_type, inputs, name=fresh_name(f"{RULE}_{scale.node.op_type}")
        )
        node.metadata_props[mark] = RULE
        node.outputs[0].dtype, node.outputs[0].shape = x.dtype, x.shape  # type: ignore[union-attr]
        made.append(node)
        value = node.outputs[0]
    graph.insert_before(found.reshape, made)
    found.reshape.replace_input_with(0, value)
    if found.between:
        found.transpose.replace_input_with(0, found.reshape.outputs[0])
    if found.after:
        last = found.after[-1].node.outputs[0]
        last.replace_all_uses_with(found.transpose.outputs[0])
    old = [s.node for s in [*found.between, *found.after]]
    graph.remove(old[::-1], safe=True)


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    while name in graph.initializers:
        name = f"{name}_"
    value = ir.Value(name=name, shape=ir.Shape(array.shape), const_value=ir.tensor(array))
    value.dtype = ir.DataType.from_numpy(array.dtype)
    graph.register_initializer(value)
    return value


def undo_value_scales(graph: ir.Graph, mark: str) -> int:
    """Write the scales this rule moved after their head Transpose again (``[1, KV, 1,
    Hv]``, one number as one) where the head split still reads them alone; how many."""
    undone = 0
    for node in [n for n in graph if n.metadata_props.get(mark) == RULE]:
        reshape = _only_reader(node.outputs[0]) if node.graph is graph else None
        transpose = _only_reader(reshape.outputs[0]) if _is(reshape, "Reshape") else None  # type: ignore[union-attr]
        heads = _heads(reshape) if _is(transpose, "Transpose") else None  # type: ignore[arg-type]
        perm = list(attribute_value(transpose, "perm", []) or []) if heads else None  # type: ignore[arg-type]
        if perm != _HEAD_PERM or transpose.outputs[0].is_graph_output():  # type: ignore[union-attr]
            continue
        chain = [node]
        while (earlier := _data(chain[0]).producer()) is not None:
            if (
                earlier.metadata_props.get(mark) != RULE
                or _only_reader(earlier.outputs[0]) is not chain[0]
            ):
                break
            chain.insert(0, earlier)
        _scale_after(graph, chain, reshape, transpose, heads)  # type: ignore[arg-type]
        undone += 1
    return undone


def _data(op: ir.Node) -> ir.Value:
    """The input of a scale op that is not its constant."""
    return op.inputs[1] if op.inputs[0].const_value is not None else op.inputs[0]  # type: ignore[return-value,union-attr]


def _scale_after(
    graph: ir.Graph,
    chain: list[ir.Node],
    reshape: ir.Node,
    transpose: ir.Node,
    heads: tuple[int, int],
) -> None:
    """``chain`` (scale ops on the projection, in order) computed again after the head
    Transpose on constants of ``[1, KV, 1, Hv]``; the head split reads what they read."""
    split, made = transpose.outputs[0], []
    readers = list(split.uses())
    value = split
    for op in chain:
        side = 0 if op.inputs[0].const_value is not None else 1  # type: ignore[union-attr]
        array = op.inputs[side].const_value.numpy()  # type: ignore[union-attr]
        laid = array if array.ndim == 0 else array.reshape(1, heads[0], 1, heads[1])
        constant = _initializer(graph, f"{op.inputs[side].name}_heads", laid)  # type: ignore[union-attr]
        node = ir.Node("", op.op_type, [value, constant] if side == 1 else [constant, value])
        node.name = f"{op.name}_after_split"
        node.outputs[0].dtype, node.outputs[0].shape = split.dtype, split.shape
        made.append(node)
        value = node.outputs[0]
    for use in readers:
        use.node.replace_input_with(use.idx, value)
    reshape.replace_input_with(0, _data(chain[0]))
    graph.insert_after(transpose, made)
    graph.remove(chain[::-1], safe=True)
