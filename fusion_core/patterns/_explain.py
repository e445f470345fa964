"""Near misses where the matcher never completed a binding: the first step that failed.

A pattern with ``explain: {node: softmax, when: attention_softmax}`` asks the matcher
to explain every graph node that could play ``softmax``, passes the probe ``when`` (a
predicate registered by name in ``_probes.py``, code for what a pattern cannot say)
and is in no candidate and no near miss: the binding is grown from that node alone, step by step in
the matcher's order, and the deepest partial binding names the step that found no node
(which pattern node, which op, reached how, and what the graph has there instead).
Patterns that share a probe compete per graph node; the one that got furthest is the
closest, and its name is the near miss's pattern.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import onnx_ir as ir

from autofusion.fusion_core.ir import consumers
from autofusion.fusion_core.patterns._match import Match
from autofusion.fusion_core.patterns._near_miss import NearMiss
from autofusion.fusion_core.patterns._probes import PROBES

__all__ = ["explain_unmatched"]

_MAX_STATES = 20_000  # partial bindings tried per graph node and pattern


@dataclass
class _Failure:
    depth: int = -1
    reason: str = ""
    names: tuple[str, ...] = ()


def explain_unmatched(search, plans: Iterable, result) -> None:
    """Append one near miss per probed graph node that nothing matched or explained."""
    covered = {id(n) for m in result.candidates for n in m.nodes.values()}
    named = {name for miss in result.near_misses for name in miss.nodes}
    best: dict[int, tuple[_Failure, str]] = {}
    order: list[ir.Node] = []
    for plan in plans:
        explain = plan.pattern.explain
        anchor = plan.specs[explain.node]
        probe = PROBES[explain.when]
        nodes = [n for op in anchor.op for n in search.index.get(op, ())]
        for node in sorted(nodes, key=lambda n: search.positions[id(n)]):
            if id(node) in covered or (node.name and node.name in named) or not probe(node):
                continue
            failure = _deepest(search, plan, node)
            if failure is None:
                continue  # it binds: the matcher reported it (or another pattern took it)
            if id(node) not in best:
                order.append(node)
            if id(node) not in best or failure.depth > best[id(node)][0].depth:
                best[id(node)] = (failure, plan.pattern.name)
    for node in order:
        failure, pattern = best[id(node)]
        result.near_misses.append(NearMiss(pattern, *_named(node, failure)))


def _named(node: ir.Node, failure: _Failure) -> tuple[tuple[str, ...], str]:
    """The near miss's nodes and reason, the probed node always among the nodes: a
    failure at the anchor (or a search out of budget) has bound nothing yet."""
    reason = failure.reason or (
        f"{_label(node)} left: the search from it stopped after {_MAX_STATES} partial bindings"
    )
    own = node.name or f"<{node.op_type}>"
    names = failure.names if own in failure.names else (own, *failure.names)
    return names, reason


def _deepest(search, plan, node: ir.Node) -> _Failure | None:
    """The deepest failed step of ``plan`` grown from ``node``; None if it binds."""
    failure = _Failure()
    budget = [_MAX_STATES]

    def fail(depth: int, nodes: dict, reason: str) -> None:
        if depth > failure.depth:
            failure.depth, failure.reason = depth, reason
            failure.names = tuple(_names(plan, nodes))

    def walk(depth: int, graph_node: ir.Node, nodes: dict, free: dict, order: dict) -> bool:
        budget[0] -= 1
        if budget[0] < 0:
            return False
        step = plan.steps[depth]
        spec = plan.specs[step.node]
        fits = list(search._fits(plan, spec, graph_node, nodes, free, order))
        if not fits:
            fail(depth, nodes, _misfit(plan, step, graph_node, nodes, free, order))
            return False
        for perm, new_free in fits:
            nodes[spec.id], order[spec.id] = graph_node, perm
            free.update(new_free)
            if depth + 1 == len(plan.steps):
                match = Match(plan.pattern, dict(nodes), dict(free), dict(order))
                reason = next((r for c in plan.pattern.constraints if (r := c.check(match))), None)
                if reason is None:
                    return True
                fail(depth + 1, nodes, reason)
            else:
                nxt = plan.steps[depth + 1]
                found = search._candidates(nxt, nodes, free, order)
                if not found:
                    fail(depth + 1, nodes, _nothing(plan, nxt, nodes, free, order))
                if any(walk(depth + 1, c, nodes, free, order) for c in found):
                    return True
            del nodes[spec.id], order[spec.id]
            for name in new_free:
                del free[name]
        return False

    if walk(0, node, {}, {}, {}):
        return None
    return failure


def _names(plan, nodes: dict) -> list[str]:
    return [
        nodes[n.id].name or f"<{nodes[n.id].op_type}>" for n in plan.pattern.nodes if n.id in nodes
    ]


def _label(node: ir.Node) -> str:
    return f"{node.op_type} {node.name!r}" if node.name else f"an unnamed {node.op_type}"


def _ops(spec) -> str:
    return spec.op[0] if len(spec.op) == 1 else " or ".join(spec.op)


def _where(plan, step, nodes: dict, free: dict, order: dict) -> tuple[str, list[ir.Node]]:
    """What the step looks for, in words, and the graph nodes it found there."""
    spec = plan.specs[step.node]
    if step.how == "free":
        value = free[step.other]
        return f"{_ops(spec)} {step.node!r} also reading ${step.other} ({value.name!r})", []
    other = nodes[step.other]
    bound = f"{step.other} ({_label(other)})"
    if step.how == "consumer":
        value = other.outputs[step.index]
        return (
            f"{_ops(spec)} {step.node!r} reading output {step.index} of {bound}",
            consumers(value),
        )
    actual = order.get(step.other, ())
    idx = actual[step.index] if step.index < len(actual) else step.index
    value = other.inputs[idx] if idx < len(other.inputs) else None
    producer = value.producer() if value is not None else None
    what = f"{_ops(spec)} {step.node!r} computing input {step.index} of {bound}"
    return what, [producer] if producer is not None else []


def _nothing(plan, step, nodes: dict, free: dict, order: dict) -> str:
    what, _ = _where(plan, step, nodes, free, order)
    if step.how == "producer":
        return f"expected {what}, which is a graph input or a constant"
    return f"expected {what}, which nothing reads"


def _misfit(plan, step, graph_node: ir.Node, nodes: dict, free: dict, order: dict) -> str:
    spec = plan.specs[step.node]
    if step.how == "anchor":
        return f"{_label(graph_node)} cannot play {step.node!r}"
    what, there = _where(plan, step, nodes, free, order)
    found = ", ".join(_label(n) for n in there) or _label(graph_node)
    if graph_node.op_type in spec.op:
        return f"expected {what}; {found} does not read the values the pattern needs"
    return f"expected {what}; found {found}"
