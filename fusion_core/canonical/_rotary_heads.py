"""Rule ``transpose_before_rotary``: a rotary embedding written out on ``[B, S, N, H]``
heads before their head Transpose rotates the transposed heads instead.

Gemma-4 applies ``apply_rotary_pos_emb(q, cos, sin, unsqueeze_dim=2)`` to the heads
``q`` of shape ``[B, S, N, H]`` (after its q/k norm) and transposes them after::

    y = Transpose(x * Unsqueeze(c, 2) + rotate_half(x) * Unsqueeze(s, 2), [0, 2, 1, 3])

Every step of the rotation acts on the last axis alone (Slices and the Concat of
``rotate_half`` on it, Neg, and products with ``cos`` and ``sin`` broadcast over the
heads), and the Transpose keeps the last axis last, so the Transpose commutes with each:
the same value is ``x' * Unsqueeze(c, 1) + rotate_half(x') * Unsqueeze(s, 1)`` with
``x' = Transpose(x, [0, 2, 1, 3])``, the spelling of Llama's ``[B, N, S, H]`` heads that
``rotary_embedding.yaml`` reads. The same products of the same elements: equal bit for
bit. A ``cos`` that is no Unsqueeze on axis 2 is transposed as the heads are.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import drop_unread, int64s
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import entries

__all__ = ["transposes_before_rotaries"]

RULE = "transpose_before_rotary"
_ONNX = ("", "ai.onnx")
_HEAD_PERM = [0, 2, 1, 3]
_UNSQUEEZE_INPUT = 13  # Unsqueeze takes its axes as an input from opset 13


@dataclass(frozen=True)
class _Rotation:
    """``add = Add(Mul(x, cos), Mul(Concat(Neg(hi), lo), sin))``, as found."""

    x: ir.Value
    cos_mul: ir.Node
    sin_mul: ir.Node
    rot: ir.Node  # the Concat
    neg: ir.Node
    lo: ir.Node  # Slice of x: the first half
    hi: ir.Node  # Slice of x: the second half
    add: ir.Node


def transposes_before_rotaries(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Move every head Transpose after a written-out rotation before it; how many."""
    moved = 0
    for transpose in list(graph):
        if transpose.graph is not graph or not _head_transpose(transpose):
            continue
        found = _rotation(transpose.inputs[0])  # type: ignore[arg-type]
        if found is None:
            continue
        _rotate_transposed(graph, transpose, found, _Names(graph, fresh_name, mark))
        moved += 1
    return moved


def _op(node: ir.Node | None, op: str) -> bool:
    return node is not None and node.op_type == op and node.domain in _ONNX


def _head_transpose(node: ir.Node) -> bool:
    if not _op(node, "Transpose") or attribute_value(node, "perm", None) != _HEAD_PERM:
        return False
    source = node.inputs[0]
    return source is not None and source.shape is not None and len(source.shape) == 4


def _rotation(value: ir.Value) -> _Rotation | None:
    """The rotate-half rotation ``value`` is the sum of, read alone by the Transpose."""
    add = value.producer()
    if not _op(add, "Add") or len(value.uses()) != 1 or value.is_graph_output():
        return None
    assert add is not None
    for first, second in (add.inputs, add.inputs[::-1]):
        cos_mul = first.producer() if first is not None else None
        sin_mul = second.producer() if second is not None else None
        if _op(cos_mul, "Mul") and _op(sin_mul, "Mul"):
            found = _parts(add, cos_mul, sin_mul)  # type: ignore[arg-type]
            if found is not None:
                return found
    return None


def _parts(add: ir.Node, cos_mul: ir.Node, sin_mul: ir.Node) -> _Rotation | None:
    rot = next((v.producer() for v in sin_mul.inputs if _op(v and v.producer(), "Concat")), None)
    if rot is None or len(rot.inputs) != 2 or not _last_axis(rot, "axis"):
        return None
    neg, lo = (v.producer() if v is not None else None for v in rot.inputs)
    hi = neg.inputs[0].producer() if _op(neg, "Neg") and neg.inputs[0] is not None else None  # type: ignore[union-attr]
    if not (_op(lo, "Slice") and _op(hi, "Slice")) or lo.inputs[0] is not hi.inputs[0]:  # type: ignore[union-attr]
        return None
    x = lo.inputs[0]  # type: ignore[union-attr]
    if x not in cos_mul.inputs or not all(_last_axis_slice(s) for s in (lo, hi)):  # type: ignore[union-attr]
        return None
    internal = [(rot, sin_mul), (neg, rot), (lo, rot), (hi, neg), (cos_mul, add), (sin_mul, add)]
    if any(len(a.outputs[0].uses()) != 1 or a.outputs[0].is_graph_output() for a, _ in internal):  # type: ignore[union-attr]
        return None
    return _Rotation(x, cos_mul, sin_mul, rot, neg, lo, hi, add)  # type: ignore[arg-type]


def _last_axis(node: ir.Node, name: str) -> bool:
    return attribute_value(node, name, None) in (-1, 3)


def _last_axis_slice(node: ir.Node) -> bool:
    """A Slice on the last axis of a rank-4 value only, its axes a constant input."""
    if len(node.inputs) < 4 or node.inputs[3] is None:
        return False
    axes = entries(node.inputs[3])
    return axes is not None and len(axes) == 1 and axes[0] in (-1, 3)


class _Names:
    def __init__(self, graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> None:
        self.graph, self.fresh_name, self.mark = graph, fresh_name, mark

    def node(self, like: ir.Node, inputs: list, perm: bool = True) -> ir.Node:
        """A copy of ``like`` reading ``inputs``, its output ``like``'s transposed."""
        attrs = [ir.Attr(a.name, a.type, a.value) for a in like.attributes.values()]
        node = ir.Node(
            "", like.op_type, inputs, attrs, name=self.fresh_name(f"{RULE}_{like.op_type}")
        )
        node.metadata_props[self.mark] = RULE
        old, out = like.outputs[0], node.outputs[0]
        out.name = self.fresh_name(f"{old.name or RULE}_heads")
        out.dtype, out.shape = old.dtype, _transposed(old.shape) if perm else old.shape
        return node


def _transposed(shape: ir.Shape | None) -> ir.Shape | None:
    if shape is None or len(shape) != 4:
        return None
    return ir.Shape([shape[p] for p in _HEAD_PERM])


def _rotate_transposed(graph: ir.Graph, transpose: ir.Node, r: _Rotation, w: _Names) -> None:
    """Write the rotation of ``Transpose(x)``; the Transpose's readers read it."""
    heads = w.node(transpose, [r.x])
    heads.outputs[0].shape = _transposed(r.x.shape)
    lo = w.node(r.lo, [heads.outputs[0], *r.lo.inputs[1:]])
    hi = w.node(r.hi, [heads.outputs[0], *r.hi.inputs[1:]])
    neg = w.node(r.neg, [hi.outputs[0]])
    rot = w.node(r.rot, [neg.outputs[0], lo.outputs[0]])
    new = [heads, lo, hi, neg, rot]
    cos_mul = w.node(r.cos_mul, [_turned(v, r.x, heads, w, new) for v in r.cos_mul.inputs])
    sin_mul = w.node(
        r.sin_mul, [_turned(v, r.rot.outputs[0], rot, w, new) for v in r.sin_mul.inputs]
    )
    add = w.node(r.add, [cos_mul.outputs[0], sin_mul.outputs[0]])
    add.outputs[0].shape = transpose.outputs[0].shape
    graph.insert_before(r.add, [*new, cos_mul, sin_mul, add])
    out = transpose.outputs[0]
    name, out.name = out.name, None
    add.outputs[0].name = name
    out.replace_all_uses_with(add.outputs[0], replace_graph_outputs=True)
    graph.remove(transpose, safe=True)
    drop_unread(graph, [r.add])


def _turned(
    value: ir.Value | None, source: ir.Value, replaced: ir.Node, w: _Names, new: list[ir.Node]
) -> ir.Value | None:
    """The input of a product, transposed: ``replaced``'s output for ``source``, and
    ``cos`` (or ``sin``) as ``Unsqueeze(c, 1)`` for ``Unsqueeze(c, 2)``, else transposed."""
    if value is source:
        return replaced.outputs[0]
    if value is None or value.shape is None or len(value.shape) != 4:
        return value  # a scalar or a vector along the last axis: the same after it
    producer = value.producer()
    if _op(producer, "Unsqueeze") and _unsqueezed_axes(producer) in ([2], [-2]):  # type: ignore[arg-type]
        axes = [ir.AttrInt64s("axes", [1])]
        inputs = [producer.inputs[0]]  # type: ignore[union-attr]
        if _opset(w.graph) >= _UNSQUEEZE_INPUT:
            axes, inputs = [], [*inputs, int64s(w.graph, w.fresh_name, [1])]
        early = ir.Node("", "Unsqueeze", inputs, axes, name=w.fresh_name(f"{RULE}_Unsqueeze"))
    else:
        early = ir.Node("", "Transpose", [value], [ir.AttrInt64s("perm", _HEAD_PERM)])
        early.name = w.fresh_name(f"{RULE}_Transpose")
    early.metadata_props[w.mark] = RULE
    early.outputs[0].name = w.fresh_name(f"{value.name or RULE}_heads")
    early.outputs[0].dtype, early.outputs[0].shape = value.dtype, _transposed(value.shape)
    new.append(early)
    return early.outputs[0]


def _unsqueezed_axes(node: ir.Node) -> list[int] | None:
    attr = node.attributes.get("axes")
    if attr is not None:
        return [int(a) for a in attr.value]
    return entries(node.inputs[1]) if len(node.inputs) > 1 else None  # type: ignore[return-value]


def _opset(graph: ir.Graph) -> int:
    return graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0))
