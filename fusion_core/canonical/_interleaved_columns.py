"""Rule ``interleaved_columns``: heads whose last axis is read in another order (the
interleaved rope part of multi-head latent attention) are computed in that order by
their projection, whose weight columns are permuted.

DeepSeek-V2/V3, Youtu and GLM-4.7-Flash keep each head's rotary features in interleaved
pairs ``(x0, x1), (x2, x3), ...``. Transformers reads them either as one shuffle of the
last axis, ``x.view(.., d/2, 2).transpose(-1, -2).reshape(.., d)`` (then rotate_half), or
as two strided picks ``x[..., 0::2]`` and ``x[..., 1::2]`` (each pair rotated by one
angle). Each is a read of the last axis in a fixed order: the shuffle reads column
``order[j]`` at ``j`` (a Reshape to ``[.., a, b]``, the swap of the two, a Reshape back:
``order[j] = (j mod a) * b + j div a``), a Slice from ``lo`` by ``step`` or a Gather of
constant indices reads those columns. Where the picks of a value ``x`` cover its last
axis once, ``order`` is their columns one after the other (by first column), and::

    pick_i(x) == Slice(x', [o_i, o_i + n_i)),   x' = x[..., order]

(``o_i``: the columns of the picks before it, ``n_i``: its own). ``x'`` is what the
projection computes when its columns are permuted, carried through the ops between:

* ``MatMul(h, W)[..., order] == MatMul(h, W[:, order])`` and ``(y + b)[..., order] ==
  y[..., order] + b[..., order]``, the same for ``-``, ``*`` and ``/`` by a constant
  (each column is its own dot product, its own bias or scale);
* a Transpose that keeps the last axis last, and a Split or step-1 Slice of the last
  axis from ``o`` (the permutation moves only its columns ``o .. o + d - 1``);
* a Reshape whose last axis ``D`` divides the input's ``M`` (a head split ``[.., N * D]
  -> [.., N, D]``, a view ``[B, S, D] -> [B, 1, S, D]``): column ``c`` of the input is
  column ``c mod D`` of the output, so the input reads ``(c div D) * D + order[c mod
  D]``: the permutation of each head's columns.

The same products, summed in the same order: every value is unchanged, bit for bit. The
picks become contiguous Slices; the strided ones the halves the rotary pattern reads
(with ``rotary_halves``), the shuffle the value itself. Where the exporter flattened
``cat(x_nope, cat(x1 * c - x2 * s, x2 * c + x1 * s))`` into one Concat, the rotation's
two parts are joined on their own first (a Concat of Concats is the same Concat), so
``rotary_halves`` finds them.

Why this keeps the model's outputs and its cache: only the projection's columns move,
and the picks read the same values as before; the key after the rotary (what a cache
stores) is the same tensor. Refused (nothing changes) where a value between the MatMul
and the picks is read by anything but the next op on the way, a Shape, or a Slice of
columns the order leaves in place (a Split's other outputs read other columns; so does
a nope part sliced beside the rope part), where the picks do not cover the last axis
exactly once, or where the weight is no constant. The weight, bias and scale become new
initializers, the old ones dropped where nothing else reads them (a tied weight keeps
its columns for its other readers). The walk back to the projection is
``_interleaved_projection.py``.

What no fusion took is written back (``_interleaved_undo.py``): the rule notes, on each
node whose constant it permutes, the columns and the old constant, and on the MatMul the
heads' name, the order and how each pick was written; the write-back finds the reads
again where later rules replaced them. A flattened Concat that is a graph output keeps
its three inputs (its name is the graph's).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread, int64s, replace
from autofusion.fusion_core.canonical._interleaved_projection import (
    ONNX,
    projection,
    slice_columns,
)
from autofusion.fusion_core.canonical._interleaved_undo import GROUPED, KEPT, note, recorded
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims

__all__ = ["RULE", "interleaved_columns"]

RULE = "interleaved_columns"
_PICKS = frozenset({"Slice", "Gather", "Reshape"})


@dataclass
class _Pick:
    """One read of the heads' last axis: the node that reads them, the columns it reads
    in order, and the node whose output is that read (the last of a shuffle)."""

    reader: ir.Node
    columns: list[int]
    last: ir.Node


def interleaved_columns(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Move every read of heads in another order into their projection's columns; how
    many heads."""
    done = 0
    for heads in _picked_heads(graph):
        if heads.producer() is None or heads.producer().graph is not graph:  # type: ignore[union-attr]
            continue
        picks = _picks(heads)
        if picks is None:
            continue
        order = np.array([c for pick in picks for c in pick.columns], np.int64)
        if np.array_equal(order, np.arange(order.size)):
            continue  # read in order already (rotate_half's own halves)
        found = projection(heads, order)
        if found is None:
            done += _gathered_in_order(graph, heads, picks, order, fresh_name, mark)
            continue
        heads.name = heads.name or fresh_name(f"{RULE}_heads")  # the write-back finds it so
        site = {"site": fresh_name(f"{RULE}_site"), "constants": len(found.constants)}
        reads = {"heads": heads.name, "order": order.tolist(), "reads": _as_written(picks)}
        for node, index, columns in found.constants:
            was = node.inputs[index].name  # type: ignore[union-attr]
            now = _permute(graph, node, index, columns, fresh_name)
            entry = {"input": index, "columns": columns.tolist(), "was": was, "now": now}
            note(node, site | entry | (reads if node is found.way[-1] else {}))
        parts = _read_in_order(graph, heads, picks, fresh_name, mark, site["site"])
        _group_rotations(graph, parts, fresh_name, mark)
        done += 1
    return done


def _picked_heads(graph: ir.Graph) -> list[ir.Value]:
    """Rank-4 values (heads) a Slice, Gather or Reshape reads, each once. Only heads: an
    interleaved GLU (``x[..., ::2] * act(x[..., 1::2])`` of a 3-D projection) is left."""
    found: dict[int, ir.Value] = {}
    for node in graph:
        if node.op_type in _PICKS and node.domain in ONNX and node.inputs:
            value = node.inputs[0]
            dims = known_dims(value)
            if value is not None and dims is not None and len(dims) == 4:
                found.setdefault(id(value), value)
    return list(found.values())


def _picks(heads: ir.Value) -> list[_Pick] | None:
    """Every read of ``heads`` but its Shapes, as picks ordered by first column, where
    they cover the last axis exactly once; else None."""
    dims = known_dims(heads)
    if heads.is_graph_output() or dims is None or not isinstance(dims[-1], int):
        return None
    size = dims[-1]
    picks = []
    for use in heads.uses():
        if use.node.op_type == "Shape":
            continue  # reads the shape only, which stays
        pick = _pick(use.node, use.idx, size) if use.node.domain in ONNX else None
        if pick is None or pick.last.outputs[0].is_graph_output():
            return None
        picks.append(pick)
    picks.sort(key=lambda pick: pick.columns[0] if pick.columns else -1)
    covered = sorted(c for pick in picks for c in pick.columns)
    if not picks or covered != list(range(size)) or any(not p.columns for p in picks):
        return None
    return picks


def _pick(node: ir.Node, index: int, size: int) -> _Pick | None:
    """``node`` (reading the heads as its input ``index``) as a pick, else None."""
    if index != 0:
        return None
    if node.op_type == "Slice":
        columns = slice_columns(node, size, rank=4)
        return _Pick(node, columns, node) if columns else None
    if node.op_type == "Gather":
        columns = _gather_columns(node, size)
        return _Pick(node, columns, node) if columns else None
    return _shuffle(node, size)


def _gather_columns(node: ir.Node, size: int) -> list[int] | None:
    """The columns a Gather of the last axis reads (constant 1-D indices)."""
    if attribute_value(node, "axis", 0) not in (-1, 3):
        return None
    indices = constant_array(node.inputs[1])
    if indices is None or indices.ndim != 1 or indices.dtype.kind not in "iu":
        return None
    columns = [int(i) + (size if i < 0 else 0) for i in indices]
    return columns if all(0 <= c < size for c in columns) else None


def _shuffle(reshape: ir.Node, size: int) -> _Pick | None:
    """``Reshape(Transpose(Reshape(x, [.., a, b]), swap of the last two), [.., d])``:
    column ``(j mod a) * b + j div a`` of ``x`` at ``j``; else None."""
    split = known_dims(reshape.outputs[0])
    if reshape.op_type != "Reshape" or split is None or len(split) != 5:
        return None
    a, b = split[3], split[4]
    if not isinstance(a, int) or not isinstance(b, int) or a * b != size:
        return None
    swap = _only_reader(reshape.outputs[0])
    perm = attribute_value(swap, "perm", None) if swap is not None else None
    if swap is None or swap.op_type != "Transpose" or list(perm or []) != [0, 1, 2, 4, 3]:
        return None
    back = _only_reader(swap.outputs[0])
    dims = known_dims(back.outputs[0]) if back is not None else None
    if back is None or back.op_type != "Reshape" or dims is None or dims[-1] != size:
        return None
    columns = [(j % a) * b + j // a for j in range(size)]
    return _Pick(reshape, columns, back)


def _only_reader(value: ir.Value) -> ir.Node | None:
    """The one reader of ``value`` but its Shapes (in the ONNX domain), if any."""
    readers = [use for use in value.uses() if use.node.op_type != "Shape"]
    if len(readers) != 1 or readers[0].idx != 0 or value.is_graph_output():
        return None
    return readers[0].node if readers[0].node.domain in ONNX else None


def _permute(graph: ir.Graph, node: ir.Node, index: int, columns: np.ndarray, fresh_name) -> str:
    """``node`` reads a new initializer holding its constant input's columns in the order
    ``columns`` (its name returned); the old constant goes where nothing else reads it."""
    old = node.inputs[index]
    assert old is not None
    array = constant_array(old)
    assert array is not None
    permuted = np.take(array, columns, axis=-1)
    value = ir.Value(
        name=fresh_name(f"{old.name or 'weight'}_{RULE}"),
        shape=ir.Shape(permuted.shape),
        const_value=ir.tensor(permuted, dtype=old.dtype),
    )
    value.dtype = old.dtype
    graph.register_initializer(value)
    node.replace_input_with(index, value)
    if old.uses() or old.is_graph_output() or old.is_graph_input():
        return value.name  # type: ignore[return-value]
    if old.producer() is not None:
        drop_unread(graph, [old.producer()])
    elif old.name in graph.initializers:
        graph.initializers.pop(old.name)
    return value.name  # type: ignore[return-value]


def _read_in_order(
    graph: ir.Graph, heads: ir.Value, picks: list[_Pick], fresh_name, mark: str, site: str
) -> list[ir.Value]:
    """Each pick made a contiguous Slice of ``heads`` (now in the picks' order); a
    shuffle's last Reshape reads ``heads`` itself (marked with the ``site``). The
    Slices' outputs, in order."""
    parts, start = [], 0
    for pick in picks:
        end = start + len(pick.columns)
        if pick.last is not pick.reader:  # the shuffle: the Reshape back reads the heads
            swap = pick.last.inputs[0].producer()  # type: ignore[union-attr]
            pick.last.replace_input_with(0, heads)
            pick.last.metadata_props[KEPT] = site
            drop_unread(graph, [swap])
        else:
            bounds = [int64s(graph, fresh_name, [v]) for v in (start, end, -1)]
            node = ir.Node("", "Slice", [heads, *bounds], name=fresh_name(RULE))
            old = pick.reader.outputs[0]
            out = node.outputs[0]
            out.name, out.dtype, out.shape = fresh_name(f"{RULE}_part"), old.dtype, old.shape
            replace(graph, pick.reader, [node], mark, RULE)
            parts.append(out)
        start = end
    return parts


def _as_written(picks: list[_Pick]) -> list[dict]:
    """How each pick read the heads (its columns ``[start, end)`` once read in order), for
    the write-back to write it so again: its nodes' and outputs' names, its constants."""
    written, start = [], 0
    for pick in picks:
        reader, end = pick.reader, start + len(pick.columns)
        nodes = [reader]
        if pick.last is not reader:  # the shuffle: the split, the swap, the Reshape back
            nodes += [_only_reader(reader.outputs[0]), pick.last]  # type: ignore[list-item]
        entry = {
            "start": start,
            "end": end,
            "op": "shuffle" if pick.last is not reader else reader.op_type,
            "nodes": [n.name for n in nodes],
            "outputs": [n.outputs[0].name for n in nodes],
        }
        if pick.last is not reader:  # where a target is computed, 0 copies the same size
            a, b = known_dims(reader.outputs[0])[3:]  # type: ignore[index]
            entry["inputs"] = [recorded(reader.inputs[1], [0, 0, 0, a, b])]
            entry["back"] = recorded(pick.last.inputs[1], [0, 0, 0, end - start])
        else:
            entry["inputs"] = [recorded(v) for v in reader.inputs[1:]]
            entry["axis"] = attribute_value(reader, "axis", 0)
        written.append(entry)
        start = end
    return written


def _group_rotations(graph: ir.Graph, parts: list[ir.Value], fresh_name, mark: str) -> None:
    """A last-axis Concat of more than two inputs, two of them in a row ``x1 * c - x2 * s``
    and ``x2 * c + x1 * s`` of the ``parts``, reads them as a Concat of their own
    (``Concat(a, b, c) == Concat(a, Concat(b, c))``): the rotation ``rotary_halves`` reads."""
    ours = {id(p) for p in parts}
    concats = {
        id(use.node): use.node
        for value in parts
        for mul in value.uses()
        for total in mul.node.outputs[0].uses()
        for use in total.node.outputs[0].uses()
        if use.node.op_type == "Concat" and len(use.node.inputs) > 2
    }
    for concat in concats.values():
        dims = known_dims(concat.outputs[0])
        if concat.outputs[0].is_graph_output():
            continue  # its name is the graph's: a Concat of Concats would need another
        if dims is None or attribute_value(concat, "axis", 0) not in (-1, len(dims) - 1):
            continue
        inputs = list(concat.inputs)
        for i in range(len(inputs) - 1):
            first, second = inputs[i], inputs[i + 1]
            if _rotated_part(first, "Sub", ours) and _rotated_part(second, "Add", ours):
                _join(graph, concat, i, fresh_name, mark)
                break


def _rotated_part(value: ir.Value | None, op: str, ours: set[int]) -> bool:
    """``value`` is ``op`` of two products, each of one of ``ours``, read once."""
    node = value.producer() if value is not None else None
    if node is None or node.op_type != op or len(value.uses()) != 1:  # type: ignore[union-attr]
        return False
    products = [v.producer() if v is not None else None for v in node.inputs]
    return all(
        p is not None and p.op_type == "Mul" and any(id(v) in ours for v in p.inputs)
        for p in products
    )


def _join(graph: ir.Graph, concat: ir.Node, at: int, fresh_name, mark: str) -> None:
    """``concat`` with its inputs ``at`` and ``at + 1`` joined by a Concat of their own."""
    first, second = concat.inputs[at], concat.inputs[at + 1]
    inner = ir.Node(
        "", "Concat", [first, second], [ir.AttrInt64("axis", -1)], name=fresh_name(RULE)
    )
    widths = [known_dims(v) for v in (first, second)]
    out = inner.outputs[0]
    out.name, out.dtype = fresh_name(f"{RULE}_rotated"), first.dtype  # type: ignore[union-attr]
    if all(w is not None and isinstance(w[-1], int) for w in widths):
        dims = list(first.shape)  # type: ignore[union-attr, arg-type]
        out.shape = ir.Shape([*dims[:-1], widths[0][-1] + widths[1][-1]])  # type: ignore[index]
    inputs = [*concat.inputs[:at], out, *concat.inputs[at + 2 :]]
    outer = ir.Node("", "Concat", inputs, [ir.AttrInt64("axis", -1)], name=fresh_name(RULE))
    kept = concat.outputs[0]
    outer.outputs[0].name = fresh_name(f"{RULE}_heads")
    outer.outputs[0].dtype, outer.outputs[0].shape = kept.dtype, kept.shape
    axis = attribute_value(concat, "axis", 0)
    outer.metadata_props[GROUPED] = json.dumps([at, axis, kept.name])
    replace(graph, concat, [inner, outer], mark, RULE)


def _gathered_in_order(
    graph: ir.Graph, heads: ir.Value, picks: list[_Pick], order: np.ndarray, fresh_name, mark
) -> int:
    """Where no projection computes ``heads`` (one head normed before its rotary: Dots3's
    shared key part): ``x' = Gather(heads, order, axis=-1)`` read by contiguous Slices, the
    same elements (``pick_i(x) == Slice(x', [o_i, o_i + n_i))``, exactly). Not for one
    Gather of every column (what this leaves), nor a shuffle (the Reshape back reads the
    whole axis in order already); 1 where written."""
    dims = known_dims(heads)
    if dims is None or dims[1] != 1:  # one head [B, 1, S, d]; a [B, S, N, d] rotary stays
        return 0
    if len(picks) < 2 or any(p.last is not p.reader for p in picks):
        return 0
    indices = int64s(graph, fresh_name, order.tolist())
    gather = ir.Node("", "Gather", [heads, indices], [ir.AttrInt64("axis", -1)])
    gather.name = fresh_name(RULE)
    gather.metadata_props[mark] = RULE
    ordered = gather.outputs[0]
    ordered.name = fresh_name(f"{RULE}_ordered")
    ordered.dtype, ordered.shape = heads.dtype, heads.shape
    graph.insert_before(picks[0].reader, gather)
    parts = _read_in_order(graph, ordered, picks, fresh_name, mark, fresh_name(f"{RULE}_site"))
    _group_rotations(graph, parts, fresh_name, mark)
    return 1
