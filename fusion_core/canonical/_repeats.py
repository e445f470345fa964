"""Rule ``repeat_kv``: the key and value heads a grouped-query attention repeats, spelled
one way, transformers' ``repeat_kv``::

    Reshape(Expand(Unsqueeze(kv, 2), [1, 1, G, 1, 1]), [B, N, L, H])

Exporters and hand-written models repeat a KV head for its ``G = N / KV`` query heads in
other ways that compute the same tensor, and each becomes that one:

* ``Tile(Unsqueeze(kv, 2), [1, 1, G, 1, 1])``: a Tile that repeats only axes of size 1
  is an Expand to the repeats;
* ``Concat(u, u, ..., u)`` of one value along an axis of size 1: an Expand as well;
* ``Gather(kv, [0, .., 0, 1, .., 1, ...], axis=1)``, each KV head picked for its query
  heads in order (``torch.repeat_interleave(kv, G, dim=1)``): the Unsqueeze, Expand and
  Reshape above. What no fusion took is put back as a Gather (``undo_gathers``).

Each is exact: the same elements in the same places.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import free_name, int64s, put_back, replace
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims

__all__ = ["RULE", "repeats_as_expand", "undo_gathers"]

RULE = "repeat_kv"
_GATHER = "autofusion.canonical.repeat_gather"  # the Gather's indices, to put it back
_ONNX = ("", "ai.onnx")
_UNSQUEEZE_INPUT = 13  # opset from which Unsqueeze reads its axes as an input


def repeats_as_expand(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Write every Tile, Concat and Gather that repeats KV heads as repeat_kv; how many."""
    done = 0
    for node in list(graph):
        if node.domain not in _ONNX or node.outputs[0].is_graph_output():
            continue
        if node.op_type == "Tile":
            new = _tile_as_expand(node)
        elif node.op_type == "Concat":
            new = _concat_as_expand(node, fresh_name, graph)
        elif node.op_type == "Gather":
            new = _gather_as_repeat(node, fresh_name, graph)
        else:
            continue
        if new is None:
            continue
        for made in new:
            made.name = fresh_name(f"{RULE}_{made.op_type}")
            made.outputs[0].name = fresh_name(f"{RULE}_{made.op_type.lower()}")
        _typed_like(new[-1].outputs[0], node.outputs[0])
        replace(graph, node, new, mark, RULE)
        done += 1
    return done


def undo_gathers(graph: ir.Graph, mark: str) -> int:
    """Put back as one Gather every repeat this rule wrote for a Gather that no fusion
    took (its Unsqueeze, Expand and Reshape still there); how many."""
    undone = 0
    for reshape in [
        n for n in graph if n.metadata_props.get(mark) == RULE and _GATHER in n.metadata_props
    ]:
        expand = reshape.inputs[0].producer() if reshape.inputs[0] is not None else None
        unsqueeze = expand.inputs[0].producer() if expand is not None else None
        if expand is None or unsqueeze is None or unsqueeze.metadata_props.get(mark) != RULE:
            continue
        if len(expand.outputs[0].uses()) != 1 or len(unsqueeze.outputs[0].uses()) != 1:
            continue
        indices = json.loads(reshape.metadata_props[_GATHER])
        constant = ir.Value(
            name=free_name(graph, f"{reshape.name}_indices"),
            shape=ir.Shape([len(indices)]),
            const_value=ir.tensor(np.array(indices, np.int64)),
        )
        constant.dtype = ir.DataType.INT64
        graph.register_initializer(constant)
        gather = ir.Node("", "Gather", [unsqueeze.inputs[0], constant], [ir.AttrInt64("axis", 1)])
        put_back(graph, gather, reshape, [reshape, expand, unsqueeze])
        undone += 1
    return undone


def _tile_as_expand(node: ir.Node) -> list[ir.Node] | None:
    """``Expand(x, repeats)`` for a Tile that repeats only axes where ``x`` has size 1."""
    repeats = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    dims = known_dims(node.inputs[0]) if node.inputs[0] is not None else None
    if repeats is None or dims is None or repeats.ndim != 1 or len(dims) != repeats.size:
        return None
    if not all(r == 1 or d == 1 for r, d in zip(repeats.tolist(), dims, strict=True)):
        return None
    return [ir.Node("", "Expand", [node.inputs[0], node.inputs[1]])]


def _concat_as_expand(node: ir.Node, fresh_name, graph: ir.Graph) -> list[ir.Node] | None:
    """``Expand(x, [1, .., G, .., 1])`` for a Concat of ``x`` G times on an axis of size 1."""
    parts = list(node.inputs)
    if len(parts) < 2 or parts[0] is None or any(p is not parts[0] for p in parts):
        return None
    dims = known_dims(parts[0])
    axis = attribute_value(node, "axis", None)
    if dims is None or axis is None or not -len(dims) <= axis < len(dims):
        return None
    axis %= len(dims)
    if dims[axis] != 1:
        return None
    shape = [1] * len(dims)
    shape[axis] = len(parts)
    return [ir.Node("", "Expand", [parts[0], int64s(graph, fresh_name, shape)])]


def _gather_as_repeat(node: ir.Node, fresh_name, graph: ir.Graph) -> list[ir.Node] | None:
    """repeat_kv's three ops for a Gather of heads ``[0]*G + [1]*G + ...`` on axis 1 of a
    ``[B, KV, L, H]`` value (KV and H known numbers, G > 1), from opset 13 on (where
    Unsqueeze takes its axes as an input, as written here)."""
    if graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 0)) < _UNSQUEEZE_INPUT:
        return None
    source = node.inputs[0]
    indices = constant_array(node.inputs[1]) if len(node.inputs) > 1 else None
    dims = known_dims(source) if source is not None else None
    if indices is None or indices.ndim != 1 or dims is None or len(dims) != 4:
        return None
    if attribute_value(node, "axis", 0) not in (1, -3):
        return None
    kv, size = dims[1], dims[3]
    if not isinstance(kv, int) or not isinstance(size, int) or kv < 1:
        return None
    heads = indices.size
    group = heads // kv
    if group < 2 or group * kv != heads:
        return None
    if not np.array_equal(indices, np.arange(heads) // group):
        return None
    unsqueeze = ir.Node("", "Unsqueeze", [source, int64s(graph, fresh_name, [2])])
    expand = ir.Node(
        "", "Expand", [unsqueeze.outputs[0], int64s(graph, fresh_name, [1, 1, group, 1, 1])]
    )
    merge = ir.Node(
        "", "Reshape", [expand.outputs[0], int64s(graph, fresh_name, [0, heads, -1, size])]
    )
    merge.metadata_props[_GATHER] = json.dumps(indices.tolist())
    b, _, length, _ = source.shape  # type: ignore[misc]
    unsqueeze.outputs[0].shape = ir.Shape([b, kv, 1, length, size])
    expand.outputs[0].shape = ir.Shape([b, kv, group, length, size])
    for made in (unsqueeze, expand):
        made.outputs[0].dtype = source.dtype  # type: ignore[union-attr]
    return [unsqueeze, expand, merge]


def _typed_like(value: ir.Value, source: ir.Value) -> None:
    value.dtype, value.shape = source.dtype, source.shape
