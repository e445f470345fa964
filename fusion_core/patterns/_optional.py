"""Optional groups: one pattern for a block whose spelling may leave some steps out.

Attention is the case that asked for it: the scores may be soft-capped (Div, Tanh, Mul)
or not, masked (an Add) or not, the probabilities guarded against NaN (IsNaN, Where) or
not, the key and value heads repeated for grouped queries (Unsqueeze, Expand, Reshape)
or not; written out, that is sixteen patterns. A node marked ``optional: <group>`` belongs
to a group that may be absent as a whole; ``through: k`` names the input that stands for
the node's output when it is (0 by default: a Where guard passes its input 2 on)::

    - {id: is_nan, op: IsNaN, inputs: {0: softmax}, optional: nan_guard}
    - {id: guard, op: Where, inputs: {0: is_nan, 2: softmax}, optional: nan_guard, through: 2}
    - {id: context, op: MatMul, inputs: {0: guard, 1: $v}}

The matcher matches each plain variant (every subset of the groups, the most nodes
first) and keeps, of the candidates that bind the same nodes and more, the largest. In a
variant without a group, an edge from the group's node reads its ``through`` input
instead, a constraint that names one of its nodes (or a free input only it read) is left
out, and a rewriter param naming one of its nodes is None: the rewriter sees which steps
the block has. The groups a variant holds are its ``groups``, which a target profile may
price on their own (``kernel_factors: {attention+softcap: 6.0}``).
"""

from __future__ import annotations

from itertools import combinations
from typing import TYPE_CHECKING, Any

from autofusion.fusion_core.patterns._constraints import constraint_ref_nodes
from autofusion.fusion_core.patterns._refs import parse_edge, parse_ref

if TYPE_CHECKING:
    from autofusion.fusion_core.patterns._spec import PatternSpec

__all__ = ["MAX_OPTIONAL_GROUPS", "check_optional_groups", "pattern_variants"]

# Each group doubles the variants the matcher runs.
MAX_OPTIONAL_GROUPS = 5


def optional_groups(spec: PatternSpec) -> list[str]:
    """The group names, in the order their first node appears."""
    return list(dict.fromkeys(n.optional for n in spec.nodes if n.optional is not None))


def check_optional_groups(spec: PatternSpec) -> None:
    """Raise ValueError (with the field's path) where the groups cannot be left out."""
    groups = optional_groups(spec)
    if not groups:
        return
    if len(groups) > MAX_OPTIONAL_GROUPS:
        raise ValueError(
            f"nodes: {len(groups)} optional groups {groups}; at most {MAX_OPTIONAL_GROUPS} "
            "(each doubles the variants matched): split the pattern"
        )
    if all(n.optional is not None for n in spec.nodes):
        raise ValueError("nodes: every node is optional; keep at least one")
    for k, node in enumerate(spec.nodes):
        if node.optional is not None and node.through not in node.inputs:
            raise ValueError(
                f"nodes.{k}.through: {node.id!r} has no input {node.through} to pass on when "
                f"its group {node.optional!r} is absent"
            )
    if spec.explain is not None and spec.node(spec.explain.node).optional is not None:
        raise ValueError(
            f"explain.node: {spec.explain.node!r} is optional; name a node always there"
        )
    pattern_variants(spec)  # each variant must be a pattern on its own (connected...)


def pattern_variants(spec: PatternSpec) -> list[PatternSpec]:
    """Every plain pattern the spec stands for, the most groups first."""
    groups = optional_groups(spec)
    if not groups:
        return [spec]
    found = []
    for dropped in range(len(groups) + 1):
        for absent in combinations(groups, dropped):
            variant = _without(spec, set(absent))
            variant._groups = tuple(g for g in groups if g not in absent)
            found.append(variant)
    return found


def _without(spec: PatternSpec, absent: set[str]) -> PatternSpec:
    gone = {n.id: n for n in spec.nodes if n.optional in absent}

    def source(text: str) -> str:
        seen = set()
        ref = parse_edge(text)
        while ref.node in gone:
            if ref.node in seen:  # cannot happen in an acyclic pattern; be safe
                break
            seen.add(ref.node)
            node = gone[ref.node]
            text = node.inputs[node.through]
            ref = parse_edge(text)
        return text

    nodes = [
        {
            **n.model_dump(exclude={"optional", "through", "inputs"}),
            "inputs": {i: source(s) for i, s in n.inputs.items()},
        }
        for n in spec.nodes
        if n.id not in gone
    ]
    kept_free = {
        parse_edge(s).name for n in nodes for s in n["inputs"].values() if s.startswith("$")
    }
    data: dict[str, Any] = spec.model_dump(exclude={"nodes", "constraints", "exposes"})
    data["nodes"] = nodes
    data["constraints"] = [c for c in spec.constraints if not _names_absent(c, gone, kept_free)]
    data["exposes"] = [e for e in spec.exposes if parse_ref(e).node not in gone]
    params = data["rewriter"]["params"]
    for key, value in params.items():
        if key.endswith("_node") and isinstance(value, str) and value in gone:
            params[key] = None
    if spec.explain is not None:
        data["explain"] = spec.explain.model_dump()
    try:
        return type(spec).model_validate(data)
    except ValueError as exc:
        label = "+".join(sorted(absent))
        raise ValueError(f"nodes: without the optional group(s) {label}: {exc}") from None


def _names_absent(constraint: Any, gone: dict, kept_free: set[str]) -> bool:
    for text, node_id in constraint_ref_nodes(constraint):
        if node_id in gone:
            return True
        ref = parse_ref(text)
        if ref.kind == "free" and ref.name not in kept_free:
            return True
    return False
