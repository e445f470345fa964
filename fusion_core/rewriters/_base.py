"""What every rewriter shares: the interface, the context it works in, and how a
rewrite is applied to the graph (with provenance on every new node).

A rewriter is code registered by name. It is given a match and validated params and
returns either a ``Rewrite`` (new nodes and which old values they replace) or a reason
string when it cannot rewrite this match for this target. It never mutates the graph
itself: ``apply_rewrite`` does, so a rejected rewrite leaves nothing behind.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import onnx_ir as ir
from pydantic import BaseModel, ConfigDict

from autofusion.fusion_core import provenance as metadata_keys
from autofusion.fusion_core.ir import constant_array
from autofusion.fusion_core.patterns import Match, PatternSpec
from autofusion.fusion_core.rewriters._effect import RewriteEffect, matched
from autofusion.fusion_core.rewriters._new_types import type_new_values
from autofusion.fusion_core.targets import Target

__all__ = [
    "NotACandidate",
    "Params",
    "Rewrite",
    "RewriteContext",
    "Rewriter",
    "AppliedRewrite",
    "apply_rewrite",
    "discard",
    "missing_output",
    "opset_refusal",
    "provenance",
    "stop_reading",
]


class NotACandidate(str):
    """A refusal that is no near miss: what matched is something the rewriter itself
    made (the router a mixture of experts keeps to feed the kernel), so the pattern's
    match there explains nothing a user could change. The rounds drop it silently."""


class Params(BaseModel):
    """Base of each rewriter's params; fields naming pattern nodes end in ``_node``."""

    model_config = ConfigDict(extra="forbid")


@dataclass
class RewriteContext:
    """The model being rewritten and the target; hands out unique names."""

    model: ir.Model
    target: Target
    # Position of each node at the start of the current round (set by the pipeline), so
    # placing a rewrite costs O(match size), not a scan of the graph.
    positions: dict[int, int] = field(default_factory=dict)
    # The graph being rewritten: the main graph, or the body of an If/Loop/Scan (set by
    # the pipeline); new nodes and initializers go there.
    current_graph: ir.Graph | None = None
    _used_names: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        # Names are unique across every graph: a body sees the outer graph's values.
        graph = self.model.graph
        self._used_names.update(v.name for v in graph.initializers.values() if v.name)
        self._used_names.update(v.name for v in graph.inputs if v.name)
        for node in ir.traversal.RecursiveGraphIterator(graph):
            self._used_names.update(v.name for v in node.outputs if v.name)
            if node.name:
                self._used_names.add(node.name)
            for attr in node.attributes.values():
                for body in _bodies(attr):
                    self._used_names.update(v.name for v in body.inputs if v.name)
                    self._used_names.update(k for k in body.initializers if k)

    @property
    def graph(self) -> ir.Graph:
        return self.current_graph if self.current_graph is not None else self.model.graph

    @property
    def opset(self) -> int:
        return self.model.opset_imports.get("", self.model.opset_imports.get("ai.onnx", 1))

    def fresh_name(self, hint: str) -> str:
        name, k = hint, 1
        while name in self._used_names:
            name, k = f"{hint}_{k}", k + 1
        self._used_names.add(name)
        return name

    def initializer(self, hint: str, array: np.ndarray) -> ir.Value:
        """A new constant initializer holding ``array``, registered in the graph."""
        return self.tensor_initializer(hint, ir.tensor(array))

    def tensor_initializer(self, hint: str, tensor: ir.TensorProtocol) -> ir.Value:
        """A new constant initializer holding ``tensor`` as it is (an ``ir.LazyTensor``
        stays unread), typed and shaped as the tensor says, registered in the graph."""
        name = self.fresh_name(hint)
        value = ir.Value(name=name, shape=ir.Shape(tensor.shape), const_value=tensor)
        value.dtype = tensor.dtype
        self.graph.register_initializer(value)
        return value

    def use_domain(self, domain: str, version: int = 1) -> None:
        self.model.opset_imports.setdefault(domain, version)


def _bodies(attr: ir.Attr) -> list[ir.Graph]:
    if attr.type == ir.AttributeType.GRAPH:
        return [attr.as_graph()]
    if attr.type == ir.AttributeType.GRAPHS:
        return list(attr.as_graphs())
    return []


@dataclass
class Rewrite:
    """The replacement of one match: new nodes, and the old values they stand in for.

    ``absorbed``: nodes outside the match that the rewrite removes with it, because the
    rewriter traced them as part of the block it replaces (a mixture of experts is
    anchored on its router and spans the experts' computation, whose spelling no fixed
    pattern describes). They are held to the match's rule: nothing outside may read
    what they compute, except the values ``replaced`` names.

    ``notes``: what the rewrite leaves as the graph had it although the op could do it
    (a sliding window the proof did not reach stays in the bias), each reported as a
    near miss of kind ``rewriter`` at the fused place."""

    new_nodes: list[ir.Node]
    replaced: list[tuple[ir.Value, ir.Value]]  # (old value, new value)
    absorbed: list[ir.Node] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


class Rewriter(ABC):
    """A named piece of code that replaces a match with faster nodes for a target."""

    name: ClassVar[str]
    targets: ClassVar[frozenset[str]] = frozenset({"generic", "onnxruntime"})
    Params: ClassVar[type[Params]] = Params

    def validate_params(self, raw: dict, pattern: PatternSpec) -> Params:
        """Validate params against the schema and the pattern's node ids."""
        params = self.Params.model_validate(raw)
        ids = {n.id for n in pattern.nodes}
        for field_name, value in params.model_dump().items():
            if field_name.endswith("_node") and value is not None and value not in ids:
                raise ValueError(
                    f"rewriter.params.{field_name}: {value!r} names no node of the pattern "
                    f"(nodes are {sorted(ids)})"
                )
        return params

    @abstractmethod
    def rewrite(self, match: Match, params: Params, ctx: RewriteContext) -> Rewrite | str:
        """Build the replacement, or return why this match cannot be rewritten."""

    def cost_effect(self, match: Match, params: Params) -> RewriteEffect:
        """What ``rewrite`` does to the cost of the matched nodes (``_effect.py``): by
        default one kernel for all of them, computing the same FLOPs."""
        return RewriteEffect(matched(match))


def scale_factor(node: ir.Node, factor: ir.Value | None) -> float | str:
    """What a Mul by ``factor`` (or a Div by it) multiplies by: a constant scalar, or
    why not."""
    array = constant_array(factor)
    if array is None or array.size != 1:
        return f"{node.op_type} {node.name!r} does not scale by a constant scalar"
    value = float(array.reshape(-1)[0])
    if node.op_type == "Div":
        if value == 0:
            return f"Div {node.name!r} divides by 0"
        value = 1.0 / value
    return value


def provenance(node: ir.Node) -> tuple[list[str], list[str]]:
    """(original node names, original value names) a node stands for."""
    props = node.metadata_props
    names = metadata_keys.replaced_nodes(props)
    if names is not None:
        return names, metadata_keys.replaced_values(props)
    return [node.name or f"<{node.op_type}>"], []


def opset_refusal(op: str, needed: int, ctx: RewriteContext, instead: str = "") -> str:
    """The one refusal for an op newer than the model's opset, with the way out."""
    reason = (
        f"{op} needs opset {needed}; the model imports opset {ctx.opset} "
        f"(--upgrade-opset {needed} converts it)"
    )
    return f"{reason}; {instead}" if instead else reason


def missing_output(match: Match, rewrite: Rewrite) -> str | None:
    """Why the rewrite would lose a value still needed outside the match, or None.

    Every output of a replaced node that is a graph output or has a reader outside the
    match must be among the values the rewrite replaces (a MaxPool's Indices output,
    a BatchNormalization's training outputs, a horizontal sibling's result...).
    """
    plumbing = match.shape_plumbing(rewrite.new_nodes)
    members = {id(n) for n in [*match.nodes.values(), *plumbing, *rewrite.absorbed]}
    replaced = {id(old) for old, _ in rewrite.replaced}
    dropped = {id(v) for n in plumbing for v in n.outputs}
    for node in rewrite.new_nodes:
        for value in node.inputs:
            if value is not None and id(value) in dropped:
                return (
                    f"the rewrite reads {value.name!r}, computed from the shape of a value "
                    "it removes"
                )
    owned = [*match.nodes.items(), *((n.name or n.op_type, n) for n in rewrite.absorbed)]
    for node_id, node in owned:
        for index, value in enumerate(node.outputs):
            if id(value) in replaced:
                continue
            if value.is_graph_output():
                return f"{node_id}.out{index} ({value.name!r}) is a graph output the rewrite drops"
            readers = [u.node for u in value.uses() if id(u.node) not in members]
            if readers:
                return (
                    f"{node_id}.out{index} ({value.name!r}) is read by {readers[0].op_type} "
                    f"{readers[0].name!r}, but the rewrite drops it"
                )
    return None


def discard(rewrite: Rewrite) -> None:
    """Forget a rewrite that will not be applied: its nodes stop being readers."""
    for node in rewrite.new_nodes:
        stop_reading(node)


def stop_reading(node: ir.Node) -> None:
    """``node`` reads nothing any more, nor do the nodes of its subgraphs (an If's
    branches read outer values by reference: left reading, they would keep a value
    looking read outside a later match)."""
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            subgraphs = [attr.value]
        elif attr.type == ir.AttributeType.GRAPHS:
            subgraphs = list(attr.value)
        else:
            continue
        for subgraph in subgraphs:
            for inner in subgraph:
                stop_reading(inner)
    for index in range(len(node.inputs)):
        node.replace_input_with(index, None)


@dataclass
class AppliedRewrite:
    """What ``apply_rewrite`` changed, so that ``undo`` can put it back: the removed nodes
    with what they read, and every reader and graph output it moved to a new value."""

    graph: ir.Graph
    new_nodes: list[ir.Node]
    old_nodes: list[tuple[ir.Node, tuple[ir.Value | None, ...]]]
    moved: list[tuple[ir.Value, ir.Value, list[tuple[ir.Node, int]], list[int]]]
    # What replace_nodes_and_values overwrote on each new value (its name, type, shape
    # and constant): a value that was there before must get them back
    overwritten: list[tuple[ir.Value, str | None, object, object, object]]

    def undo(self) -> None:
        """The graph as it was before the rewrite (up to node order: sort it after).
        Readers that later rewrites gave the new values read the old ones again."""
        graph, made = self.graph, {id(n) for n in self.new_nodes}
        for value, name, type_, shape, const in self.overwritten:
            value.name, value.type, value.shape, value.const_value = name, type_, shape, const
        for old, new, readers, outputs in self.moved:
            if new.producer() is not None and id(new.producer()) in made:
                # only this rewrite made it: every reader, graph outputs too, reads the old
                ir.convenience.replace_all_uses_with(new, old, replace_graph_outputs=True)
            else:  # a value that was there before: move back only the readers moved
                for node, index in readers:
                    if index < len(node.inputs) and node.inputs[index] is new:
                        node.replace_input_with(index, old)
            for index in outputs:
                graph.outputs[index] = old
        anchor = next((n for n in self.new_nodes if n.graph is graph), None)
        restored = [node for node, _ in self.old_nodes if node.graph is None]
        if anchor is not None:
            graph.insert_before(anchor, restored)
        else:
            graph.extend(restored)
        for node, inputs in self.old_nodes:
            for index, value in enumerate(inputs):
                if node.inputs[index] is not value:
                    node.replace_input_with(index, value)
        present = [n for n in self.new_nodes if n.graph is graph]
        for node in present:  # stop reading, so nothing points at what goes
            stop_reading(node)
        graph.remove(present, safe=False)


def apply_rewrite(ctx: RewriteContext, match: Match, rewrite: Rewrite) -> AppliedRewrite:
    """Replace the match's nodes with ``rewrite.new_nodes`` and record provenance;
    returns what was changed, which ``AppliedRewrite.undo`` puts back. Every value the
    new nodes compute gets the type and shape it is known to have (``_new_types``)."""
    graph = ctx.graph
    # the shape arithmetic that only fed the match goes with it (Match.shape_plumbing)
    removed = list(
        {
            id(n): n
            for n in [
                *match.nodes.values(),
                *match.shape_plumbing(rewrite.new_nodes),
                *rewrite.absorbed,
            ]
        }.values()
    )
    old_nodes = sorted(removed, key=lambda n: ctx.positions.get(id(n), -1))
    replaced_nodes, replaced_values = _originals(old_nodes, rewrite)
    for node in rewrite.new_nodes:
        metadata_keys.write(
            node.metadata_props, match.pattern.name, replaced_nodes, replaced_values
        )
        if not node.name:
            node.name = ctx.fresh_name(f"{match.pattern.name}_{node.op_type}")
    old_values = [old for old, _ in rewrite.replaced]
    new_values = [new for _, new in rewrite.replaced]
    applied = AppliedRewrite(
        graph,
        list(rewrite.new_nodes),
        [(node, tuple(node.inputs)) for node in old_nodes],
        [
            (
                old,
                new,
                [(use.node, use.idx) for use in old.uses()],
                [k for k, out in enumerate(graph.outputs) if out is old],
            )
            for old, new in rewrite.replaced
        ],
        [(new, new.name, new.type, new.shape, new.const_value) for new in new_values],
    )
    ir.convenience.replace_nodes_and_values(
        graph, old_nodes[-1], old_nodes, rewrite.new_nodes, old_values, new_values
    )
    # after the replacement: the values replaced have given theirs, and every value has
    # the name the graph gave it, which the inference of the nodes reading it needs
    type_new_values(rewrite.new_nodes, dict(ctx.model.opset_imports))
    return applied


def _originals(old_nodes: list[ir.Node], rewrite: Rewrite) -> tuple[list[str], list[str]]:
    """The input graph's nodes and values the rewrite of ``old_nodes`` stands for, each
    once: two matched nodes of one earlier fusion (the Add and Relu a generic
    ``conv_bn_add_relu`` re-emits) stand for the same originals."""
    replaced_nodes: list[str] = []
    replaced_values: list[str] = []
    for node in old_nodes:
        names, values = provenance(node)
        replaced_nodes += names
        replaced_values += values
    kept = {id(old) for old, _ in rewrite.replaced}
    replaced_values += [
        v.name for n in old_nodes for v in n.outputs if id(v) not in kept and v.name and v.uses()
    ]
    return list(dict.fromkeys(replaced_nodes)), list(dict.fromkeys(replaced_values))


def copy_attributes(node: ir.Node, *, drop: Iterable[str] = ()) -> list[ir.Attr]:
    """Fresh copies of a node's attributes (an Attr belongs to one node)."""
    dropped = set(drop)
    return [
        ir.Attr(a.name, a.type, a.value) for a in node.attributes.values() if a.name not in dropped
    ]
