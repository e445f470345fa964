"""Rule ``one_kv_head``: a fused projection split after an Unsqueeze, and its one KV head
repeated from that Unsqueeze, read as the head splits every attention pattern reads.

GPTBigCode (StarCoder, SantaCoder) writes multi-query attention as
``qkv.unsqueeze(1).split([N * H, H, H], dim=3)``: q is reshaped into its heads, and the
one key (and value) head ``[B, 1, S, H]`` is repeated for the N query heads by
``unsqueeze(2).expand(...).reshape(B, N, S, H)``. Three exact steps bring that to the
spelling of one KV head repeated by repeat_kv:

* ``Split(Unsqueeze(x, a), s)`` is ``Unsqueeze(Split(x, s'), a)`` per part (``s'`` the
  split axis counted without the inserted one);
* a Reshape of an Unsqueeze is the Reshape of its input, when the target copies no
  dimension (no 0 entry, or ``allowzero``): a Reshape reads only the elements in order;
* ``Unsqueeze(k, 1)`` of a ``[B, S, H]`` part (the key's and the value's, read by
  repeat_kv or a rotary of the one head) is the one-head split ``Transpose(Reshape(k,
  [0, 0, 1, H]), [0, 2, 1, 3])``; put back where no fusion took it
  (``undo_one_head_splits``).
"""

from __future__ import annotations

from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import (
    by_op_type,
    free_name,
    int64s,
    put_back,
    replace,
)
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import axes_of, dim_entries, known_dims

__all__ = ["RULE", "one_kv_heads", "undo_one_head_splits"]

RULE = "one_kv_head"
_ONE_HEAD = "autofusion.canonical.one_head"  # the Transpose of a one-head split
_ONNX = ("", "ai.onnx")


def one_kv_heads(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Apply the three steps wherever they hold; how many."""
    return by_op_type(
        graph,
        {
            "Split": lambda node: _split_first(graph, node, fresh_name, mark),
            "Reshape": lambda node: _reshape_through(node, mark),
            "Unsqueeze": lambda node: _one_head(graph, node, fresh_name, mark),
        },
    )


def undo_one_head_splits(graph: ir.Graph, mark: str) -> int:
    """Put back as ``Unsqueeze(k, 1)`` every one-head split no fusion took."""
    del mark
    undone = 0
    for turn in [n for n in graph if _ONE_HEAD in n.metadata_props]:
        split = turn.inputs[0].producer() if turn.inputs[0] is not None else None
        if split is None or split.op_type != "Reshape" or len(turn.inputs[0].uses()) != 1:  # type: ignore[union-attr]
            continue
        axes = ir.Value(
            name=free_name(graph, f"{turn.name}_axes"),
            const_value=ir.tensor([1], dtype=ir.DataType.INT64),
        )
        axes.dtype, axes.shape = ir.DataType.INT64, ir.Shape([1])
        graph.register_initializer(axes)
        put_back(graph, ir.Node("", "Unsqueeze", [split.inputs[0], axes]), turn, [turn, split])
        undone += 1
    return undone


def _split_first(graph: ir.Graph, split: ir.Node, fresh_name, mark: str) -> int:
    """``Split(Unsqueeze(x, axes), axis)`` as an Unsqueeze of each part of ``x``."""
    unsqueeze = split.inputs[0].producer() if split.inputs[0] is not None else None
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or unsqueeze.domain not in _ONNX:
        return 0
    axes, source = axes_of(unsqueeze), unsqueeze.inputs[0]
    dims = known_dims(split.inputs[0])
    axis = attribute_value(split, "axis", 0)
    if axes is None or source is None or dims is None or len(split.inputs[0].uses()) != 1:  # type: ignore[union-attr]
        return 0
    if any(o.is_graph_output() for o in split.outputs) or split.inputs[0].is_graph_output():  # type: ignore[union-attr]
        return 0
    rank = len(dims)
    axis %= rank
    inserted = sorted(a % rank for a in axes)
    if axis in inserted:
        return 0
    inner_axis = axis - sum(1 for a in inserted if a < axis)
    attributes = [ir.AttrInt64("axis", inner_axis)]
    if "num_outputs" in split.attributes:
        attributes.append(split.attributes["num_outputs"])
    if "split" in split.attributes:  # before opset 13 the sizes are an attribute
        attributes.append(split.attributes["split"])
    first = ir.Node(
        "", "Split", [source, *split.inputs[1:]], attributes, num_outputs=len(split.outputs)
    )
    first.name = fresh_name(f"{RULE}_Split")
    nodes = [first]
    for part, out in zip(first.outputs, split.outputs, strict=True):
        part.name = fresh_name(f"{RULE}_part")
        part.dtype = out.dtype
        if out.shape is not None:
            part.shape = ir.Shape([d for i, d in enumerate(out.shape) if i not in inserted])
        again = ir.Node(
            "", "Unsqueeze", [part, unsqueeze.inputs[1]], name=fresh_name(f"{RULE}_Unsqueeze")
        )
        again.outputs[0].dtype, again.outputs[0].shape = out.dtype, out.shape
        again.outputs[0].name = fresh_name(f"{RULE}_unsqueezed")
        nodes.append(again)
    for node in nodes:
        node.metadata_props[mark] = RULE
    graph.insert_before(split, nodes)
    for out, again in zip(split.outputs, nodes[1:], strict=True):
        out.replace_all_uses_with(again.outputs[0])
    graph.remove([split, unsqueeze], safe=True)
    return 1


def _reshape_through(reshape: ir.Node, mark: str) -> int:
    """``Reshape(Unsqueeze(x), t)`` reads ``x`` when ``t`` copies no dimension (for the
    Unsqueezes the first step wrote: other spellings read theirs)."""
    unsqueeze = reshape.inputs[0].producer() if reshape.inputs[0] is not None else None
    if unsqueeze is None or unsqueeze.op_type != "Unsqueeze" or unsqueeze.domain not in _ONNX:
        return 0
    if unsqueeze.metadata_props.get(mark) != RULE:
        return 0
    if attribute_value(reshape, "allowzero", 0) != 1:
        target = dim_entries(reshape.inputs[1]) if len(reshape.inputs) > 1 else None
        if target is None or any(e is None or e == 0 for e in target):
            return 0
    source = unsqueeze.inputs[0]
    if source is None:
        return 0
    reshape.replace_input_with(0, source)
    if not unsqueeze.outputs[0].uses() and not unsqueeze.outputs[0].is_graph_output():
        unsqueeze.graph.remove(unsqueeze, safe=True)  # type: ignore[union-attr]
    return 1


def _one_head(graph: ir.Graph, unsqueeze: ir.Node, fresh_name, mark: str) -> int:
    """``Unsqueeze(k, 1)`` of a ``[B, S, H]`` part as its one-head split."""
    source = unsqueeze.inputs[0]
    dims = known_dims(source) if source is not None else None
    if axes_of(unsqueeze) not in ([1], [-3]) or dims is None or len(dims) != 3:
        return 0
    if not isinstance(dims[2], int) or unsqueeze.outputs[0].is_graph_output():
        return 0
    readers = [use.node for use in unsqueeze.outputs[0].uses()]
    if unsqueeze.metadata_props.get(mark) != RULE or not readers:
        return 0  # only the parts the first step wrote
    if any(r.op_type == "Reshape" for r in readers):
        return 0  # the query's: its Reshape reads through it
    split = ir.Node("", "Reshape", [source, int64s(graph, fresh_name, [0, 0, 1, dims[2]])])
    turn = ir.Node("", "Transpose", [split.outputs[0]], [ir.AttrInt64s("perm", [0, 2, 1, 3])])
    b, s, h = source.shape  # type: ignore[misc,union-attr]
    split.outputs[0].shape = ir.Shape([b, s, 1, h])
    split.outputs[0].dtype = source.dtype  # type: ignore[union-attr]
    turn.outputs[0].dtype, turn.outputs[0].shape = (
        unsqueeze.outputs[0].dtype,
        unsqueeze.outputs[0].shape,
    )
    for node, hint in ((split, "one_head"), (turn, "one_head_heads")):
        node.name = fresh_name(f"{RULE}_{node.op_type}")
        node.outputs[0].name = fresh_name(f"{RULE}_{hint}")
    turn.metadata_props[_ONE_HEAD] = "1"
    replace(graph, unsqueeze, [split, turn], mark, RULE)
    return 1
