"""Rule ``position_scale``: a scale per position of the rotated query heads (Ministral-3's
and Llama-4's ``q * (1 + beta * log(1 + floor(pos / L)))``) scales the projection before
its head split instead.

Ministral-3 multiplies the query heads, after the rotary embedding, by one factor per
position ``c[b, s]`` (``c`` laid out ``[1 | B, 1, S, 1]`` against the heads ``[B, N, S,
H]``)::

    y = R(Transpose(Reshape(q, [B, S, N, H]), [0, 2, 1, 3])) * c

where every op of ``R`` between the head Transpose and ``y`` is linear in the heads and
keeps each position's row apart: Add, Sub and Neg of such terms, a Mul of one by a value
the heads do not reach (the rotary's cos and sin tables), Slices, Splits and Concats
along the head dimension (rotate_half). A factor constant along the head dimension then
commutes with each of them (``(a + b) c = a c + b c``, ``(a t) c = (a c) t``, a slice or a join of
the last axis of ``a c`` is that of ``a`` times ``c``), so::

    y = R(Transpose(Reshape(q * c', [B, S, N, H]), [0, 2, 1, 3]))      c' = c as [., S, 1]

which the rotary and attention patterns read (the rotary of a scaled projection). The
product is rounded at another place, so the two agree to float rounding; the check of
every job compares them. Only a factor the graph computes is moved (a constant scalar on
the query is SDPA's split scale, ``scale_to_scores``'s), and only where the head split,
``R`` and ``y`` have no reader outside this chain.

``undo_position_scales`` puts ``R * c`` back where no fusion took the rotation: the
scaled projection still feeds the head split alone, and ``R`` is still linear in the
heads row by row (no rotary op read it), so the graph computes what it did, bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import onnx_ir as ir

from autofusion.fusion_core.canonical._edits import by_op_type, int64s, take_place
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import known_dims

__all__ = ["RULE", "position_scales", "undo_position_scales"]

RULE = "position_scale"
_ONNX = ("", "ai.onnx")
_HEAD_PERM = [0, 2, 1, 3]
_MAX_DEPTH = 8
_MOVED = "autofusion.position_scale"  # on the scaled projection: what the undo puts back


def position_scales(graph: ir.Graph, fresh_name: Callable[[str], str], mark: str) -> int:
    """Move every per-position scale of rotated heads onto the projection; how many."""

    def step(node: ir.Node) -> int:
        found = _scaled_heads(node)
        if found is None:
            return 0
        _move(graph, fresh_name, mark, node, *found)
        return 1

    moved = by_op_type(graph, {"Mul": step})
    if moved:
        graph.sort()  # the factor may be computed after the projection it now scales
    return moved


def _scaled_heads(mul: ir.Node) -> tuple[ir.Value, ir.Value, ir.Node] | None:
    """(the heads term ``R``, the factor ``c``, the head split's Reshape) where ``mul``
    scales linear heads by one factor per position, else None."""
    if len(mul.inputs) != 2 or None in mul.inputs:
        return None
    for side in (0, 1):
        heads, factor = mul.inputs[side], mul.inputs[1 - side]
        if not _per_position(factor) or len(heads.uses()) != 1 or heads.is_graph_output():  # type: ignore[union-attr]
            continue
        chain: set[ir.Node] = set()
        split = _linear_source(heads, chain, 0)  # type: ignore[arg-type]
        if split is None or not _closed(chain, heads.producer()):  # type: ignore[union-attr,arg-type]
            continue
        reshape = split.inputs[0].producer()  # type: ignore[union-attr]
        if reshape is not None and _splits_heads(reshape):
            return heads, factor, reshape  # type: ignore[return-value]
    return None


def _splits_heads(reshape: ir.Node) -> bool:
    """Whether ``reshape`` splits a ``[B, S, D]`` projection into ``[B, S, N, H]``: its
    batch and positions stay where they were, so the factor's rows still meet them."""
    before, after = known_dims(reshape.inputs[0]), known_dims(reshape.outputs[0])
    if before is None or after is None or len(before) != 3 or len(after) != 4:
        return False
    return None not in before[:2] and before[:2] == after[:2]


def _per_position(factor: ir.Value | None) -> bool:
    """A computed factor laid out ``[1 | B, 1, S, 1]`` (or fewer leading axes)."""
    dims = known_dims(factor)
    if factor is None or dims is None or not 2 <= len(dims) <= 4 or dims[-1] != 1:
        return False
    padded = [1] * (4 - len(dims)) + dims
    # a factor of the heads themselves (a norm of one head) would scale its own input
    return padded[1] == 1 and constant_array(factor) is None and not _reaches_heads(factor, 0)


def _linear_source(value: ir.Value, chain: set[ir.Node], depth: int) -> ir.Node | None:
    """The head Transpose ``value`` is linear in, row by row, adding the ops on the way
    to ``chain``; None where some op is not (or reaches no head split)."""
    node = value.producer()
    if node is None or node.domain not in _ONNX or depth > _MAX_DEPTH:
        return None
    if node.op_type == "Transpose":
        perm = attribute_value(node, "perm", None)
        reshape = node.inputs[0].producer() if node.inputs[0] is not None else None
        if perm is None or list(perm) != _HEAD_PERM or reshape is None:
            return None
        if reshape.op_type != "Reshape" or len(node.inputs[0].uses()) != 1:  # type: ignore[union-attr]
            return None
        chain.add(node)
        return node
    terms = _linear_terms(node)
    if terms is None:
        return None
    sources = {_linear_source(term, chain, depth + 1) for term in terms}
    if len(sources) != 1 or None in sources:
        return None
    chain.add(node)
    return sources.pop()


def _linear_terms(node: ir.Node) -> list[ir.Value] | None:
    """The inputs ``node`` is linear in (each position's row apart), else None."""
    inputs = [v for v in node.inputs if v is not None]
    if node.op_type in ("Add", "Sub") and len(inputs) == 2:
        return inputs
    if node.op_type == "Neg":
        return inputs[:1]
    if node.op_type == "Mul" and len(inputs) == 2:
        # the term is the operand with a head split above it: the other is a table
        tables = [v for v in inputs if not _reaches_heads(v, 0)]
        return [v for v in inputs if v not in tables] if len(tables) == 1 else None
    if node.op_type == "Slice" and len(inputs) >= 4:
        axes = constant_array(inputs[3])
        dims = known_dims(inputs[0])
        last = len(dims) - 1 if dims else None
        if axes is None or last is None or [int(a) % (last + 1) for a in axes.ravel()] != [last]:
            return None
        return inputs[:1]
    if node.op_type in ("Concat", "Split"):  # joins or cuts of the head dimension
        axis = attribute_value(node, "axis", 0)
        dims = known_dims(inputs[0])
        if dims is None or axis % len(dims) != len(dims) - 1:
            return None
        return inputs if node.op_type == "Concat" else inputs[:1]
    return None


def _reaches_heads(value: ir.Value, depth: int, seen: dict | None = None) -> bool:
    """Whether a head Transpose may be above ``value`` (True where the walk gives up)."""
    seen = {} if seen is None else seen
    node = value.producer()
    if node is None:
        return False
    if node in seen:
        return seen[node]
    found = depth > _MAX_DEPTH * 2 or (
        node.op_type == "Transpose"
        and list(attribute_value(node, "perm", None) or []) == _HEAD_PERM
    )
    if not found:
        found = any(_reaches_heads(v, depth + 1, seen) for v in node.inputs if v is not None)
    seen[node] = found
    return found


def _closed(chain: set[ir.Node], last: ir.Node) -> bool:
    """Whether every value ``chain`` computes but ``last``'s is read only inside it (so
    that scaling them changes nothing else)."""
    for node in chain - {last}:
        for value in node.outputs:
            if value.is_graph_output() or any(use.node not in chain for use in value.uses()):
                return False
    return True


def _move(
    graph: ir.Graph,
    fresh_name: Callable[[str], str],
    mark: str,
    mul: ir.Node,
    heads: ir.Value,
    factor: ir.Value,
    reshape: ir.Node,
) -> None:
    """Scale the projection ``reshape`` splits by ``factor`` as ``[1 | B, S, 1]``; the
    heads term takes the place of ``mul``."""
    dims = known_dims(factor) or []
    target = [0, -1, 1] if len(dims) == 4 else [1, -1, 1]  # 0 copies B or 1
    rows = ir.Node("", "Reshape", [factor, int64s(graph, fresh_name, target)])
    projection = reshape.inputs[0]
    scaled = ir.Node("", "Mul", [projection, rows.outputs[0]])  # type: ignore[list-item]
    rows.outputs[0].dtype = factor.dtype
    scaled.outputs[0].dtype, scaled.outputs[0].shape = projection.dtype, projection.shape  # type: ignore[union-attr]
    for node in (rows, scaled):
        node.metadata_props[mark] = RULE
    factor_first = mul.inputs[0] is factor
    term_name = heads.name
    graph.insert_before(reshape, [rows, scaled])
    reshape.replace_input_with(0, scaled.outputs[0])
    take_place(mul.outputs[0], heads)
    graph.remove(mul, safe=True)
    # the heads term now carries the product's name: the undo finds it by that name
    scaled.metadata_props[_MOVED] = json.dumps([heads.name, term_name, factor_first])


def undo_position_scales(graph: ir.Graph, mark: str) -> int:
    """Scale the rotated heads again, not their projection, for every move this rule made
    that no fusion took; how many."""
    moved = [n for n in graph if n.metadata_props.get(mark) == RULE and _MOVED in n.metadata_props]
    if not moved:
        return 0
    by_name = {v.name: v for node in graph for v in node.outputs if v.name}
    undone = 0
    for scaled in moved:
        found = _still_moved(scaled, by_name, mark)
        if found is None:
            continue
        rows, reshape, heads = found
        _name, term_name, factor_first = json.loads(scaled.metadata_props[_MOVED])
        factor = rows.inputs[0]
        operands = [factor, heads] if factor_first else [heads, factor]
        mul = ir.Node("", "Mul", operands, name=f"{scaled.name or RULE}_undone")
        mul.outputs[0].dtype, mul.outputs[0].shape = heads.dtype, heads.shape
        graph.insert_after(heads.producer(), [mul])  # type: ignore[arg-type]
        take_place(heads, mul.outputs[0])  # the Mul's own read too: read the term again
        mul.replace_input_with(0 if not factor_first else 1, heads)
        heads.name = term_name
        reshape.replace_input_with(0, scaled.inputs[0])
        graph.remove([scaled, rows], safe=True)
        undone += 1
    if undone:
        graph.sort()  # the factor may be computed after the rotation's first op
    return undone


def _still_moved(
    scaled: ir.Node, by_name: dict[str, ir.Value], mark: str
) -> tuple[ir.Node, ir.Node, ir.Value] | None:
    """(the factor's Reshape, the head split, the heads term) of a move whose every part
    is still there and read only as the rule left it; None where a fusion took some."""
    rows = scaled.inputs[1].producer() if scaled.inputs[1] is not None else None
    if rows is None or rows.metadata_props.get(mark) != RULE or rows.inputs[0] is None:
        return None
    out = scaled.outputs[0]
    readers = [use.node for use in out.uses()]
    if out.is_graph_output() or len(readers) != 1 or readers[0].op_type != "Reshape":
        return None
    if scaled.inputs[0] is None or not _splits_heads(readers[0]):
        return None
    heads = by_name.get(json.loads(scaled.metadata_props[_MOVED])[0])
    producer = heads.producer() if heads is not None else None
    if heads is None or producer is None or producer.graph is not scaled.graph:
        return None
    chain: set[ir.Node] = set()
    turn = _linear_source(heads, chain, 0)
    if turn is None or turn.inputs[0].producer() is not readers[0]:  # type: ignore[union-attr]
        return None
    return (rows, readers[0], heads) if _closed(chain, producer) else None
