"""The write-back of rule ``interleaved_columns`` (``_interleaved_columns.py``) where no
fusion took what it wrote: the projection's constants get their columns back in the
graph's order and each read of the heads is written as it was (a strided Slice, a
Gather, or the shuffle ``Reshape, Transpose, Reshape``), so the graph computes what it
computed before, bit for bit: every reader reads the same values, and un-permuting a
permutation gives back the very same tensor.

The rule notes each site on the nodes whose constant it permuted (``note``): the
columns, the old and new constant, and on the MatMul the heads' name, the order and how
each read was written (``recorded``). The reads themselves are found again, not kept:
later rules replace them (``rotary_halves`` writes its own Slices of the halves,
``identity_slice`` and ``identity_reshape`` drop a read of the whole axis), so a read is
any Slice of the heads' columns ``[start, end)`` a pick reads once in order, and where a
pick read the whole axis, whatever reads the heads.

A site goes back only where the way from the heads to the MatMul is still the one the
rule permuted (``projection``: the same constants, every value on it read by the next op
alone), each constant is still the permuted one, and nothing a fusion wrote
(``autofusion.pattern``) reads the heads or lies on that way: a fused rotary or a merged
projection keeps the site as the rule left it. A Concat of three the rule split in two
for ``rotary_halves`` is joined again where both are still Concats.
"""

from __future__ import annotations

import json
from collections import defaultdict

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import take_place
from autofusion.fusion_core.canonical._interleaved_projection import ONNX, projection
from autofusion.fusion_core.canonical._rotary_halves import last_axis_bounds
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.provenance import PATTERN
from autofusion.fusion_core.sizes import known_dims, scalar

__all__ = ["GROUPED", "KEPT", "NOTES", "note", "recorded", "undo_interleaved_columns"]

NOTES = "autofusion.interleaved_columns"  # on each node whose constant the rule permuted
GROUPED = "autofusion.interleaved_columns.grouped"  # on the outer Concat of a split join
KEPT = "autofusion.interleaved_columns.kept"  # on a shuffle's Reshape back, reading the heads
_SWAP = [0, 1, 2, 4, 3]

Members = list[tuple[ir.Node, dict]]  # a site's noted nodes and their entries


def note(node: ir.Node, entry: dict) -> None:
    """Add ``entry`` (what the rule changed on ``node``, with its site) to ``node``."""
    entries = json.loads(node.metadata_props.get(NOTES, "[]"))
    node.metadata_props[NOTES] = json.dumps([*entries, entry])


def recorded(value: ir.Value | None, computed: list[int] | None = None) -> dict:
    """A constant input of a read as the write-back rebuilds it: its name, entries and
    type. One the graph computes is written as ``computed`` (its one entry where the
    graph fixes it): the same values, without the ops that computed them."""
    array = constant_array(value)
    if value is None or array is None:
        fixed = scalar(value)
        values = [fixed] if fixed is not None else computed
        return {"name": None, "values": values, "dtype": int(ir.DataType.INT64)}
    return {"name": value.name, "values": array.ravel().tolist(), "dtype": int(value.dtype)}  # type: ignore[arg-type]


def undo_interleaved_columns(graph: ir.Graph) -> int:
    """Write back every site no fusion took (and every split join); how many sites. The
    rule's notes go from every node."""
    sites: dict[str, Members] = defaultdict(list)
    for node in graph:
        for entry in json.loads(node.metadata_props.get(NOTES, "[]")):
            sites[entry["site"]].append((node, entry))
    names = {v.name for node in graph for v in node.outputs if v.name}
    by_name = {v.name: v for node in graph for v in node.outputs if v.name}
    names |= set(graph.initializers) | {v.name for v in graph.inputs if v.name}
    pending, undone = list(sites.values()), 0
    while pending:  # a constant two sites permuted: the later site's goes back first
        done = []
        for members in pending:
            found = _intact(members, by_name)
            if found is not None:
                _write_back(graph, members, *found, names)
                done.append(members)
        pending = [m for m in pending if m not in done]
        undone += len(done)
        if not done:
            break
    for outer in [n for n in graph if GROUPED in n.metadata_props]:
        _join_back(graph, outer, names)
    for node in graph:
        for key in (NOTES, GROUPED, KEPT):
            node.metadata_props.pop(key, None)
    return undone


def _intact(members: Members, by_name: dict[str, ir.Value]) -> tuple[ir.Value, list] | None:
    """(the heads, their reads) of a site whose every part is as the rule left it; None
    where a fusion or a later rule took some."""
    head = [entry for _node, entry in members if "reads" in entry]
    if len(head) != 1 or len(members) != head[0]["constants"]:
        return None
    for node, entry in members:
        value = node.inputs[entry["input"]]
        if value is None or value.name != entry["now"] or constant_array(value) is None:
            return None
    heads = by_name.get(head[0]["heads"])
    producer = heads.producer() if heads is not None else None
    if heads is None or producer is None or producer.graph is None or heads.is_graph_output():
        return None
    found = projection(heads, np.asarray(head[0]["order"], np.int64))
    if found is None or any(PATTERN in node.metadata_props for node in found.way):
        return None
    noted = {(id(node), entry["input"]): entry["columns"] for node, entry in members}
    permuted = {(id(node), at): columns.tolist() for node, at, columns in found.constants}
    if permuted != noted:
        return None
    reads = _reads(heads, head[0]["reads"])
    return None if reads is None else (heads, reads)


def _reads(heads: ir.Value, written: list[dict]) -> list | None:
    """Per read the rule wrote: (how it was written, the Slices of its columns now, the
    uses of the heads that read it whole); None where anything else reads the heads."""
    size = (known_dims(heads) or [None])[-1]
    by_range = {(entry["start"], entry["end"]): (entry, [], []) for entry in written}
    whole = by_range.get((0, size))
    for use in heads.uses():
        node = use.node
        if node.op_type == "Shape" and node.domain in ONNX:
            continue  # the same shape either way
        if node.domain not in ONNX or PATTERN in node.metadata_props:
            return None  # a fusion reads the heads as the rule wrote them
        bounds = last_axis_bounds(node, size) if node.op_type == "Slice" and use.idx == 0 else None
        if bounds in by_range and not node.outputs[0].is_graph_output():
            by_range[bounds][1].append(node)  # type: ignore[index]
        elif whole is not None:
            whole[2].append(use)
        else:
            return None
    return list(by_range.values())


def _write_back(
    graph: ir.Graph, members: Members, heads: ir.Value, reads: list, names: set[str]
) -> None:
    """The site's constants and reads as the graph had them."""
    for node, entry in members:
        _columns_back(graph, node, entry, names)
    for entry, slices, uses in reads:
        for part in slices:  # a Slice of the part's columns: the read in its place
            nodes = _read_nodes(graph, heads, entry, part.outputs[0], names)
            graph.insert_before(part, nodes)
            part.outputs[0].name = None  # the read's own name stays its own
            take_place(part.outputs[0], nodes[-1].outputs[0])
            graph.remove(part, safe=True)
        if uses:
            _whole_back(graph, heads, entry, uses, names)


def _whole_back(
    graph: ir.Graph, heads: ir.Value, entry: dict, uses: list[ir.Usage], names: set[str]
) -> None:
    """The read of the whole axis back between the heads and ``uses``: before a
    shuffle's Reshape back the rule kept, its split and swap; else all of it, before the
    first reader."""
    kept = [u for u in uses if u.node.metadata_props.get(KEPT) is not None]
    nodes = _read_nodes(graph, heads, entry, heads, names)
    if kept and entry["op"] == "shuffle":
        nodes.pop()  # the Reshape back is still there: it reads the swap
        uses = kept
    order = {id(node): k for k, node in enumerate(graph)}
    first = min((u.node for u in uses), key=lambda node: order[id(node)])
    graph.insert_before(first, nodes)
    for use in uses:
        use.node.replace_input_with(use.idx, nodes[-1].outputs[0])


def _read_nodes(
    graph: ir.Graph, heads: ir.Value, entry: dict, like: ir.Value, names: set[str]
) -> list[ir.Node]:
    """The nodes of the read ``entry`` records, reading ``heads``, named as they were;
    the last one's output typed as ``like``."""
    inputs = [_constant(graph, record, names) for record in entry["inputs"]]
    if entry["op"] == "shuffle":
        dims = list(heads.shape or [])
        a, b = entry["inputs"][0]["values"][3:]
        split = ir.Node("", "Reshape", [heads, inputs[0]])
        swap = ir.Node("", "Transpose", [split.outputs[0]], [ir.AttrInt64s("perm", _SWAP)])
        back = ir.Node("", "Reshape", [swap.outputs[0], _constant(graph, entry["back"], names)])
        nodes = [split, swap, back]
        for made, last in ((split, [a, b]), (swap, [b, a])):
            made.outputs[0].dtype, made.outputs[0].shape = heads.dtype, ir.Shape([*dims[:3], *last])
    elif entry["op"] == "Gather":
        nodes = [ir.Node("", "Gather", [heads, *inputs], [ir.AttrInt64("axis", entry["axis"])])]
    else:
        nodes = [ir.Node("", "Slice", [heads, *inputs])]
    for node, name, output in zip(nodes, entry["nodes"], entry["outputs"], strict=True):
        node.name = name  # the old node is gone: no other node holds its name
        node.outputs[0].name = _unique(names, output or "interleaved_columns_read")
    nodes[-1].outputs[0].dtype, nodes[-1].outputs[0].shape = like.dtype, like.shape
    return nodes


def _columns_back(graph: ir.Graph, node: ir.Node, entry: dict, names: set[str]) -> None:
    """``node`` reads its constant with the columns in the graph's order again."""
    permuted = node.inputs[entry["input"]]
    current = constant_array(permuted)
    assert permuted is not None and current is not None
    original = np.empty_like(current)
    original[..., np.asarray(entry["columns"], np.int64)] = current
    kept = graph.initializers.get(entry["was"])
    kept_array = constant_array(kept) if kept is not None else None
    if kept is None or kept_array is None or not np.array_equal(kept_array, original):
        kept = ir.Value(
            name=_unique(names, entry["was"]),
            shape=ir.Shape(original.shape),
            const_value=ir.tensor(original, dtype=permuted.dtype),
        )
        kept.dtype = permuted.dtype
        graph.register_initializer(kept)
    node.replace_input_with(entry["input"], kept)
    if not permuted.uses() and permuted.name in graph.initializers:
        graph.initializers.pop(permuted.name)


def _join_back(graph: ir.Graph, outer: ir.Node, names: set[str]) -> None:
    """One Concat of the inner Concat's inputs in ``outer``'s place, where both are
    still Concats and nothing else reads the inner one."""
    at, axis, name = json.loads(outer.metadata_props[GROUPED])
    joined = outer.inputs[at]
    inner = joined.producer() if joined is not None else None
    if inner is None or inner.op_type != "Concat" or len(inner.inputs) != 2:
        return
    if len(joined.uses()) != 1 or joined.is_graph_output():  # type: ignore[union-attr]
        return
    inputs = [*outer.inputs[:at], *inner.inputs, *outer.inputs[at + 1 :]]
    flat = ir.Node("", "Concat", inputs, [ir.AttrInt64("axis", axis)], name=f"{outer.name}_flat")
    out = outer.outputs[0]
    flat.outputs[0].dtype, flat.outputs[0].shape = out.dtype, out.shape
    graph.insert_before(outer, [flat])
    out.name = None
    take_place(out, flat.outputs[0])
    flat.outputs[0].name = _unique(names, name or f"{flat.name}_output")
    graph.remove([outer, inner], safe=True)


def _constant(graph: ir.Graph, record: dict, names: set[str]) -> ir.Value:
    """The initializer ``record`` names where it still holds its entries; else a new one
    so named (with a suffix where the name is taken)."""
    dtype = ir.DataType(record["dtype"])
    array = np.asarray(record["values"], dtype.numpy())
    found = graph.initializers.get(record["name"] or "")
    held = constant_array(found) if found is not None else None
    same = held is not None and found.dtype == dtype and held.shape == array.shape  # type: ignore[union-attr]
    if same and np.array_equal(held, array):
        return found  # type: ignore[return-value]
    value = ir.Value(
        name=_unique(names, record["name"] or "interleaved_columns_ints"),
        shape=ir.Shape(array.shape),
        const_value=ir.tensor(array, dtype=dtype),
    )
    value.dtype = dtype
    graph.register_initializer(value)
    return value


def _unique(names: set[str], name: str) -> str:
    """``name``, or with a suffix where a value is so named already; taken from now on."""
    unique, k = name, 0
    while unique in names:
        k += 1
        unique = f"{name}_{k}"
    names.add(unique)
    return unique
