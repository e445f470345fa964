"""The matcher: every candidate of every pattern, found before anything is rewritten.

Nodes are indexed by op type. For each pattern the rarest op in the graph is the
anchor; the other pattern nodes are bound by walking edges from the nodes already
bound (to a consumer, to a producer, or to another reader of a shared free input), so
the work per anchor is bounded by the pattern's size and the fan-out of its values,
and a whole search grows linearly with the graph.

A complete binding becomes a candidate only if every constraint holds and no value it
would remove escapes (is a graph output or has a reader outside the match). Otherwise it
is a near miss with the reason, so a report can say why something did not fuse.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import onnx_ir as ir

from autofusion.fusion_core.ir import consumers, node_positions
from autofusion.fusion_core.patterns._explain import explain_unmatched
from autofusion.fusion_core.patterns._match import Match
from autofusion.fusion_core.patterns._near_miss import NearMiss
from autofusion.fusion_core.patterns._refs import parse_edge
from autofusion.fusion_core.patterns._spec import NodeSpec, PatternSpec

__all__ = ["MatchResult", "Matcher", "check_match", "escape_reason"]

_STANDARD_DOMAINS = ("", "ai.onnx")


@dataclass
class MatchResult:
    candidates: list[Match] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    # a pattern whose search raised (a bug of ours or of a user pattern's constraint on a
    # graph nobody tried): its name and the exception; the other patterns' matches stand
    failed: dict[str, Exception] = field(default_factory=dict)

    def by_pattern(self) -> dict[str, int]:
        counts: dict[str, int] = defaultdict(int)
        for match in self.candidates:
            counts[match.pattern.name] += 1
        return dict(counts)


@dataclass(frozen=True)
class _Step:
    """How to find graph candidates for one pattern node from what is already bound."""

    node: str
    how: str  # "anchor", "consumer" (of a bound output), "producer" (of a bound input), "free"
    other: str = ""  # the bound pattern node, or the free input's name
    index: int = 0  # output index of `other` (consumer), or input index of `other` (producer)


class _Plan:
    """The binding order of one pattern from one anchor, and its symmetric siblings."""

    def __init__(self, pattern: PatternSpec, anchor: str) -> None:
        self.pattern = pattern
        self.specs = {n.id: n for n in pattern.nodes}
        self.steps = _binding_order(pattern, anchor)
        self.internal = pattern.internal_edges()
        # Sibling nodes written identically (same op, same sources, read by nobody in the
        # pattern) are interchangeable: bind them in graph order to avoid permutations.
        sources = {parse_edge(s).node for n in pattern.nodes for s in n.inputs.values()}
        self.ordered_pairs: list[tuple[str, str]] = []
        nodes = pattern.nodes
        for i, a in enumerate(nodes):
            for b in nodes[i + 1 :]:
                if (
                    a.id not in sources
                    and b.id not in sources
                    and (a.op, a.domain, a.inputs) == (b.op, b.domain, b.inputs)
                ):
                    self.ordered_pairs.append((a.id, b.id))


def _binding_order(pattern: PatternSpec, anchor: str) -> list[_Step]:
    steps = [_Step(anchor, "anchor")]
    bound = {anchor}
    free_bound = {parse_edge(s).name for s in pattern.node(anchor).inputs.values()}
    while len(bound) < len(pattern.nodes):
        step = _next_step(pattern, bound, free_bound)
        steps.append(step)
        bound.add(step.node)
        free_bound |= {parse_edge(s).name for s in pattern.node(step.node).inputs.values()}
    return steps


def _next_step(pattern: PatternSpec, bound: set[str], free_bound: set[str | None]) -> _Step:
    for node in pattern.nodes:
        if node.id in bound:
            continue
        for source in node.inputs.values():
            ref = parse_edge(source)
            if ref.node in bound:
                return _Step(node.id, "consumer", ref.node, ref.index)
            if ref.kind == "free" and ref.name in free_bound:
                return _Step(node.id, "free", ref.name)
        for other in pattern.nodes:
            if other.id not in bound:
                continue
            for in_index, source in other.inputs.items():
                ref = parse_edge(source)
                if ref.node == node.id:
                    return _Step(node.id, "producer", other.id, in_index)
    raise AssertionError("pattern validation guarantees a connected pattern")


class Matcher:
    """Finds all candidates of ``patterns`` in a graph; keeps no state between calls."""

    def __init__(self, patterns: Sequence[PatternSpec], *, max_matches: int = 100_000) -> None:
        self.patterns = list(patterns)
        self.max_matches = max_matches
        self._plans: dict[tuple[str, tuple[str, ...], str], _Plan] = {}

    def find(self, graph: ir.Graph) -> MatchResult:
        index: dict[str, list[ir.Node]] = defaultdict(list)
        for node in graph:
            if node.domain in _STANDARD_DOMAINS:
                index[node.op_type].append(node)
            else:
                index[f"{node.domain}::{node.op_type}"].append(node)
        search = _Search(index, node_positions(graph))
        result = MatchResult()
        for pattern in self.patterns:
            found = MatchResult()
            try:
                for variant in pattern.variants():
                    plan = self._plan(variant, index)
                    if plan is not None:
                        search.run(plan, found, self.max_matches)
            except Exception as exc:  # this pattern's matches only: the rest still fuse
                result.failed[pattern.name] = exc
                continue
            _largest_variants(found, result)
        # the fewest optional steps first: at equal depth the first variant names the near
        # miss, and a step every spelling has is the one to name
        explained = [
            self._explain_plan(v)
            for p in self.patterns
            if p.explain is not None and p.name not in result.failed
            for v in reversed(p.variants())
        ]
        if explained:
            _explain(search, explained, result)
        result.candidates.sort(key=lambda m: min(search.positions[id(n)] for n in m.nodes.values()))
        return result

    def _explain_plan(self, pattern: PatternSpec) -> _Plan:
        """The plan grown from the pattern's ``explain.node``, whatever the graph holds."""
        assert pattern.explain is not None
        key = (pattern.name, pattern.groups, f"explain:{pattern.explain.node}")
        if key not in self._plans or self._plans[key].pattern is not pattern:
            self._plans[key] = _Plan(pattern, pattern.explain.node)
        return self._plans[key]

    def _plan(self, pattern: PatternSpec, index: dict[str, list[ir.Node]]) -> _Plan | None:
        counts = {n.id: sum(len(index.get(_key(n, op), ())) for op in n.op) for n in pattern.nodes}
        if min(counts.values()) == 0:
            return None  # some op type of the pattern does not occur at all
        anchor = min(pattern.nodes, key=lambda n: counts[n.id]).id
        key = (pattern.name, pattern.groups, anchor)
        if key not in self._plans or self._plans[key].pattern is not pattern:
            self._plans[key] = _Plan(pattern, anchor)
        return self._plans[key]


def _largest_variants(found: MatchResult, result: MatchResult) -> None:
    """Add ``found`` (one pattern's variants, the most nodes first) to ``result``, but a
    candidate binding a subset of another's nodes (the block without its optional steps
    found inside the block with them) and a near miss among a candidate's nodes."""
    if len({m.pattern.groups for m in found.candidates}) <= 1:
        result.candidates.extend(found.candidates)
        result.near_misses.extend(found.near_misses)
        return
    kept: list[Match] = []
    for match in found.candidates:
        nodes = match.node_ids()
        if not any(nodes < other.node_ids() for other in found.candidates):
            kept.append(match)
    names = {name for match in kept for name in match.node_names()}
    result.candidates.extend(kept)
    result.near_misses.extend(m for m in found.near_misses if not set(m.nodes) <= names)


def _key(spec: NodeSpec, op: str) -> str:
    return op if spec.domain in _STANDARD_DOMAINS else f"{spec.domain}::{op}"


class _Search:
    """Backtracking over one plan; bindings live in plain dicts for speed."""

    def __init__(self, index: dict[str, list[ir.Node]], positions: dict[int, int]) -> None:
        self.index = index
        self.positions = positions

    def run(self, plan: _Plan, result: MatchResult, limit: int) -> None:
        anchor = plan.specs[plan.steps[0].node]
        anchors = [n for op in anchor.op for n in self.index.get(_key(anchor, op), ())]
        anchors.sort(key=lambda n: self.positions[id(n)])
        accepted: set[frozenset[int]] = set()
        missed: dict[frozenset[int], NearMiss] = {}
        for node in anchors:
            if len(accepted) >= limit:
                break
            for nodes, free, order in self._extend(plan, 0, node, {}, {}, {}):
                identity = frozenset(id(n) for n in nodes.values())
                if identity in accepted:
                    continue
                # A commutative node can bind the same nodes in two input orders; one
                # order may fail where the other holds, so a miss is kept only if no
                # order of the same nodes succeeds.
                match = Match(plan.pattern, dict(nodes), dict(free), dict(order))
                reason, kind = _first_failure(match), "constraint"
                if reason is None:
                    reason, kind = escape_reason(match, plan.internal), "escape"
                if reason is None:
                    accepted.add(identity)
                    missed.pop(identity, None)
                    result.candidates.append(match)
                    if len(accepted) >= limit:
                        break
                elif identity not in missed:
                    names = tuple(match.node_names())
                    missed[identity] = NearMiss(plan.pattern.name, names, reason, kind)
        result.near_misses.extend(missed.values())

    def _candidates(self, step: _Step, nodes: dict, free: dict, order: dict) -> list[ir.Node]:
        if step.how == "consumer":
            value = nodes[step.other].outputs[step.index]
            return consumers(value)
        if step.how == "free":
            return consumers(free[step.other])
        # producer: the node that computes the bound node's input
        other = nodes[step.other]
        actual = order.get(step.other, ())
        idx = actual[step.index] if step.index < len(actual) else step.index
        value = other.inputs[idx] if idx < len(other.inputs) else None
        producer = value.producer() if value is not None else None
        return [producer] if producer is not None else []

    def _extend(
        self, plan: _Plan, depth: int, node: ir.Node, nodes: dict, free: dict, order: dict
    ) -> Iterator[tuple[dict, dict, dict]]:
        step = plan.steps[depth]
        spec = plan.specs[step.node]
        for perm, new_free in self._fits(plan, spec, node, nodes, free, order):
            nodes[spec.id] = node
            order[spec.id] = perm
            free.update(new_free)
            if depth + 1 == len(plan.steps):
                yield nodes, free, order
            else:
                nxt = plan.steps[depth + 1]
                for candidate in self._candidates(nxt, nodes, free, order):
                    yield from self._extend(plan, depth + 1, candidate, nodes, free, order)
            del nodes[spec.id]
            del order[spec.id]
            for name in new_free:
                del free[name]

    def _fits(
        self, plan: _Plan, spec: NodeSpec, node: ir.Node, nodes: dict, free: dict, order: dict
    ) -> Iterator[tuple[tuple[int, ...], dict]]:
        """Yield each input order (and new free bindings) under which ``node`` plays ``spec``."""
        domain = spec.domain if spec.domain not in _STANDARD_DOMAINS else ""
        if node.op_type not in spec.op or (node.domain or "").replace("ai.onnx", "") != domain:
            return
        if any(n is node for n in nodes.values()):
            return
        pos = self.positions[id(node)]
        for a, b in plan.ordered_pairs:
            if a in nodes and b == spec.id and self.positions[id(nodes[a])] > pos:
                return
            if b in nodes and a == spec.id and self.positions[id(nodes[b])] < pos:
                return
        arity = len(node.inputs)
        perms = [tuple(range(arity))]
        if spec.is_commutative(node.op_type) and arity == 2:
            perms.append((1, 0))
        for perm in perms:
            new_free = self._inputs_fit(spec, node, perm, nodes, free)
            if new_free is not None and self._outputs_fit(plan, spec, node, nodes, order):
                yield perm, new_free

    @staticmethod
    def _inputs_fit(
        spec: NodeSpec, node: ir.Node, perm: tuple[int, ...], nodes: dict, free: dict
    ) -> dict | None:
        new_free: dict[str, ir.Value] = {}
        for index, source in spec.inputs.items():
            actual = perm[index] if index < len(perm) else index
            value = node.inputs[actual] if actual < len(node.inputs) else None
            if value is None:
                return None
            ref = parse_edge(source)
            if ref.kind == "free":
                bound = free.get(ref.name, new_free.get(ref.name))
                if bound is None:
                    new_free[ref.name] = value
                elif bound is not value:
                    return None
            elif ref.node in nodes:
                producer = nodes[ref.node]
                if ref.index >= len(producer.outputs) or producer.outputs[ref.index] is not value:
                    return None
        return new_free

    @staticmethod
    def _outputs_fit(plan: _Plan, spec: NodeSpec, node: ir.Node, nodes: dict, order: dict) -> bool:
        """Every bound node that reads this node's output reads it at the right input."""
        for other_id, other in nodes.items():
            for in_index, source in plan.specs[other_id].inputs.items():
                ref = parse_edge(source)
                if ref.node != spec.id:
                    continue
                perm = order.get(other_id, ())
                actual = perm[in_index] if in_index < len(perm) else in_index
                value = other.inputs[actual] if actual < len(other.inputs) else None
                if ref.index >= len(node.outputs) or node.outputs[ref.index] is not value:
                    return False
        return True


def check_match(match: Match) -> str | None:
    """Re-check a candidate after other rewrites changed the graph around it."""
    if any(node.graph is None for node in match.nodes.values()):
        return "a node of the match was removed by another rewrite"
    return _first_failure(match) or escape_reason(match, match.pattern.internal_edges())


def _first_failure(match: Match) -> str | None:
    for constraint in match.pattern.constraints:
        reason = constraint.check(match)
        if reason is not None:
            return reason
    return None


def escape_reason(match: Match, internal: set[tuple[str, int]]) -> str | None:
    """Why the match cannot be replaced: a value it removes is needed outside, or None."""
    members = match.node_ids() | {id(n) for n in match.shape_plumbing()}
    for text in match.pattern.exposes:  # others may read it, but it stays no graph output
        value = match.value(text)
        if value is not None and value.is_graph_output():
            return f"{text} ({value.name!r}) is a graph output"
    for node_id, out_index in sorted(internal):
        value = match.output(node_id, out_index)
        if value is None:
            continue
        if value.is_graph_output():
            return f"{node_id}.out{out_index} ({value.name!r}) is a graph output"
        for reader in consumers(value):
            if id(reader) not in members:
                return (
                    f"{node_id}.out{out_index} ({value.name!r}) is also used by "
                    f"{reader.op_type} {reader.name!r} outside the match"
                )
    return None


def _explain(search: _Search, plans: list[_Plan], result: MatchResult) -> None:
    """The near misses of the explained patterns; where that raises, none of them (a near
    miss only explains what did not fuse: the matches found stand)."""
    misses = list(result.near_misses)
    try:
        explain_unmatched(search, plans, result)
    except Exception as exc:
        result.near_misses = misses
        names = ", ".join(dict.fromkeys(p.pattern.name for p in plans))
        result.failed[f"explaining {names}"] = exc
