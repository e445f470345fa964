"""Rules ``one_context`` and ``context_heads``: the context ``P @ V`` of an attention as
the attention pattern reads it, one MatMul whose heads are merged by a Reshape.

``one_context``: contexts of one ``P`` joined on their last axis are the context of the
values joined so (each output column is the dot product of a row of ``P`` with one
column of one ``V_i``)::

    Concat([T](P @ V_1), .., [T](P @ V_n), axis=-1) == [T](P @ Concat(V_1, .., V_n, -1))

(``T`` the head Transpose ``[0, 2, 1, 3]``, on all parts or none). Values repeated by
repeat_kv with one group ``G`` are joined before the repeat, which repeats the joined
heads: ``Reshape(Expand(Unsqueeze(Concat(a_i, -1), 2), [1, 1, G, 1, 1]), [0, KV * G,
-1, sum H_i])``. Differential attention computes two contexts of one softmax so.
``undo_one_context`` writes the contexts apart again where no fusion took the joined
one: the same ops as before (each value's repeat with its own constants), the same values.

``context_heads``: a context read per head (ops on ``[B, S, N, Hv]`` after the head
Transpose) is read through the identity "merge the heads, split them again"::

    T(C) == Reshape(Reshape(T(C), [0, 0, N * Hv]), [0, 0, N, Hv])

so the pattern's head merge binds and the per-head readers read the split of whatever
the fused op writes in its place. A pair no fusion took is taken out again
(``undo_context_heads``).
"""

from __future__ import annotations

import json
from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import int64s
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims

__all__ = [
    "HEADS_RULE",
    "JOIN_RULE",
    "context_heads",
    "is_context",
    "one_context",
    "undo_context_heads",
    "undo_one_context",
]

JOIN_RULE, HEADS_RULE = "one_context", "context_heads"
_MERGE, _SPLIT, _TURN = (f"{HEADS_RULE}:{role}" for role in ("merge", "split", "transpose"))
_HEAD_PERM = [0, 2, 1, 3]
_ONNX = ("", "ai.onnx")
_PARTS = "autofusion.one_context"  # on the joined MatMul: how the contexts were written
_BETWEEN = frozenset({"Where", "Slice", "Cast"})  # a NaN guard, sinks dropped, a cast
Fresh = Callable[[str], str]


def _is(node: ir.Node | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in _ONNX


def _head_transpose(node: ir.Node | None) -> bool:
    return _is(node, "Transpose") and list(attribute_value(node, "perm", []) or []) == _HEAD_PERM


def _only_reader(value: ir.Value) -> ir.Node | None:
    uses = list(value.uses())
    return uses[0].node if len(uses) == 1 and not value.is_graph_output() else None


def is_context(node: ir.Node) -> bool:
    """``MatMul(P, V)`` with ``P`` a Softmax (through a NaN guard, a Slice or a Cast)."""
    if not _is(node, "MatMul"):
        return False
    producer = node.inputs[0].producer() if node.inputs[0] is not None else None
    for _ in range(4):
        if producer is None or producer.domain not in _ONNX:
            return False
        if producer.op_type == "Softmax":
            return True
        if producer.op_type not in _BETWEEN:
            return False
        data = producer.inputs[2 if producer.op_type == "Where" else 0]
        producer = data.producer() if data is not None else None
    return False


def _typed(node: ir.Node, like: ir.Value, dims: list) -> ir.Node:
    node.outputs[0].dtype, node.outputs[0].shape = like.dtype, ir.Shape(dims)
    return node


def one_context(graph: ir.Graph, fresh_name: Fresh, mark: str) -> int:
    """Join every Concat of contexts of one ``P``; how many."""
    done = 0
    for node in list(graph):
        parts = _joined_contexts(node) if _is(node, "Concat") else None
        if parts is not None:
            _join(graph, node, parts, fresh_name, mark)
            done += 1
    return done


def _joined_contexts(concat: ir.Node) -> list[tuple[ir.Node, ir.Node | None]] | None:
    """(MatMul, head Transpose or None) of each part of a last-axis Concat of contexts of
    one ``P``, each read by the Concat alone; None where it is not one."""
    out = known_dims(concat.outputs[0])
    if out is None or len(out) != 4 or attribute_value(concat, "axis", 0) not in (3, -1):
        return None
    parts = []
    for value in concat.inputs:
        producer = value.producer() if value is not None else None
        turn = producer if _head_transpose(producer) else None
        matmul = turn.inputs[0].producer() if turn is not None else producer  # type: ignore[union-attr]
        if matmul is None or not is_context(matmul):
            return None
        if turn is not None and _only_reader(matmul.outputs[0]) is not turn:
            return None
        if _only_reader(value) is not concat:  # type: ignore[arg-type]
            return None
        parts.append((matmul, turn))
    same_p = len({id(m.inputs[0]) for m, _ in parts}) == 1
    same_turn = len({t is None for _, t in parts}) == 1
    return parts if len(parts) > 1 and same_p and same_turn else None


def _join(graph: ir.Graph, concat: ir.Node, parts: list, fresh_name: Fresh, mark: str) -> None:
    values = [m.inputs[1] for m, _ in parts]
    new = _repeat_of_joined(values, graph, fresh_name)
    repeats = [_repeat_constants(v) for v in values] if new is not None else None
    if new is None:
        dims = known_dims(values[0]) or [None] * 4
        sizes = [(known_dims(v) or [None] * 4)[3] for v in values]
        last = sum(sizes) if all(isinstance(s, int) for s in sizes) else None  # type: ignore[arg-type]
        new = [_typed(ir.Node("", "Concat", values, [ir.AttrInt64("axis", -1)]), values[0],
                      [*dims[:3], last])]  # fmt: skip
    matmul = parts[0][0]
    joined = new[-1].outputs[0]
    context_dims = [*(known_dims(matmul.outputs[0]) or [None] * 3)[:3], joined.shape[3]]  # type: ignore[index]
    new.append(_typed(ir.Node("", "MatMul", [matmul.inputs[0], joined]), joined, context_dims))
    if parts[0][1] is not None:
        dims = [context_dims[i] for i in _HEAD_PERM]
        turn = ir.Node("", "Transpose", [new[-1].outputs[0]], [ir.AttrInt64s("perm", _HEAD_PERM)])
        new.append(_typed(turn, joined, dims))
    for made in new:
        made.metadata_props[mark] = JOIN_RULE
        made.name = fresh_name(f"{JOIN_RULE}_{made.op_type}")
    turned = parts[0][1] is not None
    record = {"axis": attribute_value(concat, "axis", 0), "name": concat.outputs[0].name}
    record |= {"repeats": repeats, "turn": turned, "values": [v.name for v in values]}
    new[-2 if turned else -1].metadata_props[_PARTS] = json.dumps(record)
    graph.insert_before(concat, new)
    concat.outputs[0].replace_all_uses_with(new[-1].outputs[0], replace_graph_outputs=True)
    graph.remove([concat, *[n for part in parts for n in part if n is not None]], safe=True)


def _repeat_of_joined(values: list, graph: ir.Graph, fresh_name: Fresh) -> list[ir.Node] | None:
    """repeat_kv of the joined heads when every value is repeat_kv of ``[B, KV, L, H_i]``
    with one ``KV`` and one group ``G``; None otherwise."""
    sources, groups = [], set()
    for value in values:
        reshape = value.producer()
        expand = reshape.inputs[0].producer() if _is(reshape, "Reshape") else None
        unsqueeze = expand.inputs[0].producer() if _is(expand, "Expand") else None
        if not _is(unsqueeze, "Unsqueeze") or len(unsqueeze.inputs) < 2:  # type: ignore[union-attr]
            return None
        axes = unsqueeze.inputs[1].const_value  # type: ignore[union-attr]
        source, out = unsqueeze.inputs[0], known_dims(expand.outputs[0])  # type: ignore[union-attr]
        dims = known_dims(source) if source is not None else None
        if axes is None or axes.numpy().tolist() not in ([2], 2) or dims is None or out is None:
            return None
        if len(dims) != 4 or len(out) != 5 or not isinstance(out[2], int):
            return None
        sources.append((source, dims))
        groups.add((dims[1], out[2]))
    sizes = [d[3] for _, d in sources]
    if len(groups) != 1 or not all(isinstance(s, int) for s in sizes):
        return None
    (kv, group), size = groups.pop(), sum(sizes)
    if not isinstance(kv, int):
        return None
    b, _, length, _ = sources[0][1]
    first = sources[0][0]
    join = ir.Node("", "Concat", [s for s, _ in sources], [ir.AttrInt64("axis", -1)])
    unsqueeze = ir.Node("", "Unsqueeze", [join.outputs[0], int64s(graph, fresh_name, [2])])
    ones = int64s(graph, fresh_name, [1, 1, group, 1, 1])
    expand = ir.Node("", "Expand", [unsqueeze.outputs[0], ones])
    target = int64s(graph, fresh_name, [0, kv * group, -1, size])
    reshape = ir.Node("", "Reshape", [expand.outputs[0], target])
    shapes = ([b, kv, length, size], [b, kv, 1, length, size], [b, kv, group, length, size])
    made = [_typed(n, first, s) for n, s in zip((join, unsqueeze, expand), shapes, strict=True)]
    return [*made, _typed(reshape, first, [b, kv * group, length, size])]


def context_heads(graph: ir.Graph, fresh_name: Fresh, mark: str) -> int:
    """Put the merge/split pair after every context read per head; how many."""
    done = 0
    for node in list(graph):
        if not is_context(node):
            continue
        dims = known_dims(node.outputs[0])
        if dims is None or len(dims) != 4 or not all(isinstance(d, int) for d in dims[1::2]):
            continue
        reader = _only_reader(node.outputs[0])
        if _head_transpose(reader):
            after = _only_reader(reader.outputs[0])  # type: ignore[union-attr]
            if _is(after, "Reshape") or reader.outputs[0].is_graph_output():  # type: ignore[union-attr]
                continue  # merged already (or a graph output: nothing reads it per head)
            _insert(graph, reader.outputs[0], dims, fresh_name, mark, turn=False)  # type: ignore[union-attr]
        else:
            continue  # no head Transpose: other rules take an inserted one out again
        done += 1
    return done


def _insert(
    graph: ir.Graph, value: ir.Value, dims: list, fresh_name: Fresh, mark: str, *, turn: bool
) -> None:
    """``value``'s readers read the merge/split of it (``turn``: of its head Transpose,
    transposed back)."""
    heads, size = dims[1], dims[3]
    readers = [(u.node, u.idx) for u in value.uses()]
    layout = [dims[0], dims[2], heads, size]  # [B, S, N, Hv]
    steps = [(_TURN, "Transpose", None, layout)] if turn else []
    steps += [
        (_MERGE, "Reshape", [0, 0, heads * size], [dims[0], dims[2], heads * size]),
        (_SPLIT, "Reshape", [0, 0, heads, size], layout),
    ]
    steps += [(_TURN, "Transpose", None, dims)] if turn else []
    made, source = [], value
    for role, op, target, shape in steps:
        if op == "Transpose":
            node = ir.Node("", op, [source], [ir.AttrInt64s("perm", _HEAD_PERM)])
        else:
            node = ir.Node("", op, [source, int64s(graph, fresh_name, target)])
        node.name = fresh_name(f"{HEADS_RULE}_{op}")
        node.metadata_props[mark] = role
        made.append(_typed(node, value, shape))
        source = node.outputs[0]
    graph.insert_after(value.producer(), made)  # type: ignore[arg-type]
    for reader, index in readers:
        reader.replace_input_with(index, source)


def undo_context_heads(graph: ir.Graph, mark: str) -> int:
    """Take out each merge/split pair (and its Transposes) that no fusion took: the
    split still reads the merge, which still reads what it was put after."""
    undone = 0
    for merge in [n for n in graph if n.metadata_props.get(mark) == _MERGE]:
        split = _only_reader(merge.outputs[0])
        if split is None or split.metadata_props.get(mark) != _SPLIT:
            continue  # a fusion reads the merged value: the pair is what it fused
        if split.outputs[0].is_graph_output():
            continue
        chain = [merge, split]
        first = merge.inputs[0].producer() if merge.inputs[0] is not None else None
        last_readers = [u.node for u in split.outputs[0].uses()]
        if first is not None and first.metadata_props.get(mark) == _TURN:
            back = last_readers[0] if len(last_readers) == 1 else None
            if back is None or back.metadata_props.get(mark) != _TURN:
                continue
            if back.outputs[0].is_graph_output():
                continue
            chain = [first, merge, split, back]
        source = chain[0].inputs[0]
        chain[-1].outputs[0].replace_all_uses_with(source)  # type: ignore[arg-type]
        graph.remove(chain, safe=True)
        undone += 1
    return undone


def _repeat_constants(value: ir.Value) -> list:
    """The constants of the repeat_kv computing ``value`` (Unsqueeze axes, Expand shape,
    Reshape target; None for one the graph computes), for the undo to write again."""
    reshape = value.producer()
    expand = reshape.inputs[0].producer()  # type: ignore[union-attr]
    unsqueeze = expand.inputs[0].producer()  # type: ignore[union-attr]
    inputs = (unsqueeze.inputs[1], expand.inputs[1], reshape.inputs[1])  # type: ignore[union-attr]
    arrays = (constant_array(v) if v is not None else None for v in inputs)
    return [a.ravel().tolist() if a is not None else None for a in arrays]


def undo_one_context(graph: ir.Graph, mark: str) -> int:
    """Write the contexts of one ``P`` apart again, joined by their Concat, for every join
    this rule made that no fusion took (its nodes all there, read as it left them). The
    values are the graph's own where its repeats are still there (unread until the
    clean-up after the rounds), else repeated again with the constants they had."""
    joins = [n for n in graph if _PARTS in n.metadata_props]
    if not joins:
        return 0
    by_name = {v.name: v for node in graph for v in node.outputs if v.name}
    undone = 0
    for matmul in joins:
        record = json.loads(matmul.metadata_props[_PARTS])
        found = _still_joined(matmul, record, mark)
        if found is None:
            continue
        values, written = found
        parts: list[list[ir.Node]] = []
        for i, value in enumerate(values):
            repeat = []
            if record["repeats"] is not None:
                kept = by_name.get(record["values"][i])
                kept_node = kept.producer() if kept is not None else None
                if kept_node is None or kept_node.graph is not graph:
                    repeat = _repeat_again(graph, value, record["repeats"][i], matmul)
                value = repeat[-1].outputs[0] if repeat else kept  # type: ignore[assignment]
            parts.append(repeat + _context_of(matmul.inputs[0], value, turn=record["turn"]))  # type: ignore[arg-type]
        _write_apart(graph, matmul, parts, written, record)
        undone += 1
    return undone


def _write_apart(
    graph: ir.Graph, matmul: ir.Node, parts: list[list[ir.Node]], written: list, record: dict
) -> None:
    """Each part's nodes after what they read (as an exporter writes them, value by
    value), their Concat in the place of ``written``, which goes."""
    order = {node: i for i, node in enumerate(graph)}
    after, at = None, -1
    for part in parts:
        reads = [v.producer() for node in part for v in node.inputs if v is not None]
        anchor = max((n for n in reads if n in order), key=order.__getitem__)
        if order[anchor] > at:
            after, at = anchor, order[anchor]
        graph.insert_after(after, part)  # type: ignore[arg-type]
        after = part[-1]
    contexts = [part[-1].outputs[0] for part in parts]
    join = ir.Node("", "Concat", contexts, [ir.AttrInt64("axis", record["axis"])])
    out = written[-1].outputs[0]
    join.outputs[0].dtype, join.outputs[0].shape = out.dtype, out.shape
    for k, node in enumerate([*(n for part in parts for n in part), join]):
        node.name = f"{matmul.name}_apart_{k}_{node.op_type}"
    graph.insert_after(after, [join])  # type: ignore[arg-type]
    out.replace_all_uses_with(join.outputs[0], replace_graph_outputs=True)
    graph.remove(written, safe=True)
    join.outputs[0].name = record["name"] or join.outputs[0].name


def _still_joined(
    matmul: ir.Node, record: dict, mark: str
) -> tuple[list[ir.Value], list[ir.Node]] | None:
    """(the joined parts: values, or the sources a repeat_kv repeats; the nodes the rule
    wrote, in order) where all are still there, each read only by the next."""
    written = [matmul]
    if record["turn"]:
        turn = _only_reader(matmul.outputs[0])
        if turn is None or turn.metadata_props.get(mark) != JOIN_RULE:
            return None
        written.append(turn)
    joined = matmul.inputs[1]
    for _ in range(4 if record["repeats"] is not None else 1):  # the repeat, then the join
        producer = joined.producer() if joined is not None else None
        if producer is None or producer.metadata_props.get(mark) != JOIN_RULE:
            return None
        if _only_reader(joined) is not written[0]:  # type: ignore[arg-type]
            return None
        written.insert(0, producer)
        joined = producer.inputs[0]
    concat, values = written[0], list(written[0].inputs)
    if not _is(concat, "Concat") or any(v is None or known_dims(v) is None for v in values):
        return None
    return values, written  # type: ignore[return-value]


def _repeat_again(graph: ir.Graph, source: ir.Value, constants: list, joined: ir.Node) -> list:
    """repeat_kv of ``source`` ``[B, KV, L, H]`` as the graph had it, to the heads of the
    joined context's value."""
    b, kv, length, size = known_dims(source)  # type: ignore[misc]
    heads = (known_dims(joined.inputs[1]) or [None] * 4)[1]  # type: ignore[arg-type]
    group = heads // kv if isinstance(heads, int) and isinstance(kv, int) else None
    axes, shape, target = constants
    fresh = _fresh_for(graph, joined)
    unsqueeze = ir.Node("", "Unsqueeze", [source, int64s(graph, fresh, axes or [2])])
    expand = ir.Node(
        "", "Expand", [unsqueeze.outputs[0], int64s(graph, fresh, shape or [1, 1, group, 1, 1])]
    )
    target = target or [0, heads, -1, size]
    reshape = ir.Node("", "Reshape", [expand.outputs[0], int64s(graph, fresh, target)])
    shapes = ([b, kv, 1, length, size], [b, kv, group, length, size], [b, heads, length, size])
    return [_typed(n, source, d) for n, d in zip((unsqueeze, expand, reshape), shapes, strict=True)]


def _context_of(probs: ir.Value, value: ir.Value, *, turn: bool) -> list[ir.Node]:
    """``P @ value`` and, with ``turn``, its head Transpose."""
    dims = known_dims(value) or [None] * 4
    rows = (known_dims(probs) or [None] * 4)[:3]
    made = [_typed(ir.Node("", "MatMul", [probs, value]), value, [*rows, dims[3]])]
    if turn:
        turned = [[*rows, dims[3]][i] for i in _HEAD_PERM]
        node = ir.Node("", "Transpose", [made[0].outputs[0]], [ir.AttrInt64s("perm", _HEAD_PERM)])
        made.append(_typed(node, value, turned))
    return made


def _fresh_for(graph: ir.Graph, near: ir.Node) -> Fresh:
    """Initializer names not yet taken, after ``near``'s name (the undo runs outside the
    rounds, without their name source)."""

    def fresh(hint: str) -> str:
        base, k = f"{near.name or JOIN_RULE}_{hint}", 0
        while f"{base}_{k}" in graph.initializers:
            k += 1
        return f"{base}_{k}"

    return fresh
