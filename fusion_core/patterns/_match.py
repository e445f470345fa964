"""What the matcher produces: a binding of pattern nodes to graph nodes (a near miss is
in ``_near_miss.py``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx_ir as ir

from autofusion.fusion_core.patterns._refs import ValueRef, parse_ref

if TYPE_CHECKING:
    from autofusion.fusion_core.patterns._spec import PatternSpec

__all__ = ["Match"]


@dataclass(eq=False)
class Match:
    """One candidate: where a pattern's nodes sit in the graph.

    ``input_order[node_id][k]`` is the graph input index that plays the pattern's input
    ``k`` (different from ``k`` only for a commutative node matched with swapped inputs).
    """

    pattern: PatternSpec
    nodes: Mapping[str, ir.Node]
    free_inputs: Mapping[str, ir.Value] = field(default_factory=dict)
    input_order: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def node(self, node_id: str) -> ir.Node:
        return self.nodes[node_id]

    def input(self, node_id: str, index: int) -> ir.Value | None:
        """The value at the pattern's input ``index`` of ``node_id``, None if absent."""
        node = self.nodes[node_id]
        order = self.input_order.get(node_id)
        actual = order[index] if order is not None and index < len(order) else index
        return node.inputs[actual] if actual < len(node.inputs) else None

    def output(self, node_id: str, index: int) -> ir.Value | None:
        node = self.nodes[node_id]
        return node.outputs[index] if index < len(node.outputs) else None

    def value(self, ref: str | ValueRef) -> ir.Value | None:
        """Resolve ``bn.in1``, ``conv.out0`` or ``$x`` to a graph value (None if absent)."""
        ref = parse_ref(ref) if isinstance(ref, str) else ref
        if ref.kind == "free":
            # Read through a node, not the binding: an earlier rewrite in the same round
            # may have replaced the value this match was found with.
            for node in self.pattern.nodes:
                for index, source in node.inputs.items():
                    if source == f"${ref.name}":
                        return self.input(node.id, index)
            return self.free_inputs.get(ref.name)
        if ref.kind == "in":
            return self.input(ref.node, ref.index)
        return self.output(ref.node, ref.index)

    def node_ids(self) -> frozenset[int]:
        """Identity of the matched graph nodes, to test overlap between candidates."""
        return frozenset(id(n) for n in self.nodes.values())

    def node_names(self) -> list[str]:
        """Names of the matched nodes, in the pattern's node order."""
        ordered = [self.nodes[n.id] for n in self.pattern.nodes if n.id in self.nodes]
        return [n.name or f"<{n.op_type}>" for n in ordered]

    def shape_plumbing(self, new_nodes: Iterable[ir.Node] = ()) -> list[ir.Node]:
        """Nodes outside the match that read only the shape of its values and feed only
        the match: the rewrite removes them with it, so they are no escape.
        ``new_nodes`` (a rewrite's, already reading their inputs) count as the match's.

        Why: torch's dynamo exporter spells ``k.transpose(-2, -1)`` inside attention as
        ``Shape(k) -> Slice -> Concat -> Reshape``; the Shape reads an internal value of
        the match, but what it computes only goes back into the match. A ``Shape`` or
        ``Size`` reads no data, and what follows from it is integer arithmetic on
        shapes; when any of it reaches a graph output or a node outside, it is kept and
        the match escapes as before.
        """
        members = self.node_ids() | {id(n) for n in new_nodes}
        found: dict[int, ir.Node] = {}
        for node in self.nodes.values():
            for value in node.outputs:
                for reader in {id(u.node): u.node for u in value.uses()}.values():
                    if id(reader) in members or id(reader) in found:
                        continue
                    plumbing = _shape_only(reader, members)
                    if plumbing is not None:
                        found.update(plumbing)
        return list(found.values())


_SHAPE_READERS = frozenset({"Shape", "Size"})
_PLUMBING_LIMIT = 32  # nodes: a Shape whose result spreads further is not plumbing


def _shape_only(reader: ir.Node, members: frozenset[int]) -> dict[int, ir.Node] | None:
    """``reader`` (a Shape or Size) and what it feeds outside the match, when all of it
    ends inside the match; None otherwise."""
    if reader.op_type not in _SHAPE_READERS or reader.domain not in ("", "ai.onnx"):
        return None
    found: dict[int, ir.Node] = {}
    pending = [reader]
    while pending:
        node = pending.pop()
        if id(node) in found or id(node) in members:
            continue
        if node.domain not in ("", "ai.onnx") or any(
            a.type in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)
            for a in node.attributes.values()
        ):
            return None  # a subgraph or a custom op: not shape arithmetic to drop
        found[id(node)] = node
        if len(found) > _PLUMBING_LIMIT:
            return None
        for value in node.outputs:
            if value.is_graph_output():
                return None
            pending.extend(u.node for u in value.uses())
    return found
