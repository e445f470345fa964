"""The walk back from a value to what computes it, which the block finder (``_block.py``)
and the reading of experts around another computation (``_sorted_dispatch.py``) share."""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array, constant_tensor

__all__ = ["SHAPE_ONLY", "computing", "external", "from_logits", "reading", "walk_back"]

SHAPE_ONLY = frozenset({"Shape", "Size"})


def walk_back(
    output: ir.Value, stops: set[int], limit: int
) -> tuple[dict[int, ir.Node], dict[int, ir.Value]] | None:
    """The nodes ``output`` is computed from back to ``stops`` (value ids) and constants,
    in the order the walk meets them, and the values read that are neither (graph
    inputs), in that order too; None past ``limit`` nodes. A Shape (or Size) reads no
    data: the walk does not go past it (what it reads is sized, not computed, when the
    block runs on its own: ``_proof.py``)."""
    seen: dict[int, ir.Node] = {}
    reads: dict[int, ir.Value] = {}
    stack, visited = [output], set()
    while stack:
        value = stack.pop()
        if id(value) in visited or id(value) in stops:
            continue
        visited.add(id(value))
        node = value.producer()
        if node is None:
            if constant_array(value) is None:
                reads[id(value)] = value
            continue
        if id(node) in seen:
            continue
        seen[id(node)] = node
        if len(seen) > limit:
            return None
        if node.op_type not in SHAPE_ONLY:
            stack.extend(v for v in node.inputs if v is not None)
    return seen, reads


def computing(members: dict[int, ir.Node], values: list[ir.Value | None]) -> set[int]:
    """The ids of the ``members`` (nodes by id) that ``values`` are computed from, walking
    back through members only."""
    needed: set[int] = set()
    todo = [v for v in values if v is not None]
    while todo:
        node = todo.pop().producer()
        if node is None or id(node) not in members or id(node) in needed:
            continue
        needed.add(id(node))
        todo.extend(v for v in node.inputs if v is not None)
    return needed


def from_logits(nodes: list[ir.Node], logits: ir.Value) -> list[ir.Node]:
    """The ``nodes`` (in graph order) computed from ``logits``, constants and shapes alone:
    a router's own steps (its choice, its weights, the masks between; a mask's shape may
    be read from what ``nodes`` read, not from what they compute)."""
    known = {id(logits)}
    made = {id(v) for n in nodes for v in n.outputs}
    part = []
    for node in nodes:
        data = [v for v in node.inputs if v is not None and constant_tensor(v) is None]
        sized = node.op_type in SHAPE_ONLY and all(id(v) not in made for v in data)
        if sized or all(id(v) in known for v in data):
            part.append(node)
            known.update(id(v) for v in node.outputs)
    return part


def reading(nodes: list[ir.Node], value: ir.Value) -> set[int]:
    """The ids of the outputs of ``nodes`` (in graph order) computed from ``value``: of
    a router's own steps, those its logits reach (not a shape read beside them)."""
    reached = {id(value)}
    for node in nodes:
        if any(v is not None and id(v) in reached for v in node.inputs):
            reached.update(id(v) for v in node.outputs)
    return reached - {id(value)}


def external(nodes: list[ir.Node]) -> list[ir.Value]:
    """The values ``nodes`` read that none of them computes."""
    made = {id(v) for n in nodes for v in n.outputs}
    seen: dict[int, ir.Value] = {}
    for node in nodes:
        for value in node.inputs:
            if value is not None and id(value) not in made:
                seen.setdefault(id(value), value)
    return list(seen.values())
