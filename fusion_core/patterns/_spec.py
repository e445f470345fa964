"""The pattern specification: a fusion described as data (YAML or JSON).

A pattern is a small DAG of op nodes. Edges are written on the consumer: ``inputs:
{0: conv}`` means "input 0 of this node is output 0 of node ``conv``"; ``$x`` names a
free input, and every node that reads ``$x`` must read the *same* value, which is how
horizontal patterns (siblings sharing an input) are written. Example::

    name: conv_bn
    priority: 20
    targets: [generic, onnxruntime]
    nodes:
      - {id: conv, op: [Conv, ConvTranspose]}
      - {id: bn, op: BatchNormalization, inputs: {0: conv}}
    constraints:
      - {kind: constant, values: [conv.in1, bn.in1, bn.in2, bn.in3, bn.in4]}
      - {kind: consumers, value: conv.out0, eq: 1}
    rewriter: {name: fold_batchnorm, params: {producer: conv, batchnorm: bn}}
"""

from __future__ import annotations

import re
from collections import defaultdict
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from autofusion.fusion_core.patterns._constraints import Constraint, constraint_ref_nodes
from autofusion.fusion_core.patterns._optional import check_optional_groups, pattern_variants
from autofusion.fusion_core.patterns._probes import PROBES
from autofusion.fusion_core.patterns._refs import parse_edge, parse_ref
from autofusion.fusion_core.targets import TARGET_NAMES, TargetName

__all__ = [
    "COMMUTATIVE_OPS",
    "TARGET_NAMES",
    "TargetName",
    "CostHints",
    "ExplainSpec",
    "NodeSpec",
    "PatternSpec",
    "RewriterRef",
]

# Binary ops whose two inputs may be swapped without changing the result.
COMMUTATIVE_OPS = frozenset({"Add", "Mul", "Max", "Min", "Sum"})
_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_STANDARD_DOMAINS = ("", "ai.onnx")
# onnxruntime's own ops registered in the ONNX domain (no ONNX schema): rms_norm emits
# SimplifiedLayerNormalization on the onnxruntime target and skip_rms_norm matches it.
RUNTIME_ONNX_DOMAIN_OPS = frozenset({"SimplifiedLayerNormalization"})
MAX_PATTERN_NODES = 64
MAX_CONSTRAINTS = 256


class NodeSpec(BaseModel):
    """One op node of the pattern."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    domain: str = ""  # declared before `op` so the op-type check can read it
    op: tuple[str, ...]
    inputs: dict[int, str] = Field(default_factory=dict)
    commutative: bool | None = None  # None: by the matched op type (Add, Mul, ...)
    # A node of an optional group (``_optional.py``): the pattern also matches without
    # every node of the group, and then whatever read this node's output reads its input
    # ``through`` instead (a NaN guard Where(IsNaN(p), 0, p) passes p, its input 2, on).
    optional: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    through: int = Field(default=0, ge=0)

    @field_validator("op", mode="before")
    @classmethod
    def _one_or_many(cls, value: Any) -> Any:
        return (value,) if isinstance(value, str) else value

    @field_validator("op")
    @classmethod
    def _op_types_exist(cls, ops: tuple[str, ...], info: Any) -> tuple[str, ...]:
        if not ops:
            raise ValueError("list at least one op type")
        domain = info.data.get("domain", "")
        if domain in _STANDARD_DOMAINS:
            unknown = [
                op for op in ops if not _is_onnx_op(op) and op not in RUNTIME_ONNX_DOMAIN_OPS
            ]
            if unknown:
                raise ValueError(f"unknown ONNX op type(s) {unknown} in the default domain")
        return ops

    @field_validator("inputs")
    @classmethod
    def _edges_parse(cls, inputs: dict[int, str]) -> dict[int, str]:
        for index, source in inputs.items():
            if index < 0:
                raise ValueError(f"input index {index} is negative")
            parse_edge(source)
        return inputs

    def is_commutative(self, op_type: str) -> bool:
        """Whether a graph node of ``op_type`` playing this node may have swapped inputs.

        Decided per matched op, so ``op: [Add, Sub]`` swaps an Add but never a Sub.
        """
        if self.commutative is not None:
            return self.commutative
        return op_type in COMMUTATIVE_OPS


class RewriterRef(BaseModel):
    """The rewriter (code, registered by name) that replaces a match, with its params."""

    model_config = ConfigDict(extra="forbid")
    name: str
    params: dict[str, Any] = Field(default_factory=dict)


class CostHints(BaseModel):
    """Used by the cost model when shapes are unknown: expected fractions saved (0..1)."""

    model_config = ConfigDict(extra="forbid")
    memory_saving: float | None = Field(default=None, ge=0, le=1)
    compute_saving: float | None = Field(default=None, ge=-1, le=1)


class ExplainSpec(BaseModel):
    """Explain graph nodes no binding reached: every node that could play ``node`` and
    passes the probe ``when`` (registered by name, fusion_core/patterns/_probes.py)
    but is in no candidate gets a near miss naming the first step that failed."""

    model_config = ConfigDict(extra="forbid")
    node: str
    when: str

    @field_validator("when")
    @classmethod
    def _known_probe(cls, when: str) -> str:
        if when not in PROBES:
            raise ValueError(f"unknown probe {when!r}; known: {sorted(PROBES)}")
        return when


class PatternSpec(BaseModel):
    """A fusion pattern: what to find, what must hold, and which rewriter replaces it."""

    model_config = ConfigDict(extra="forbid")

    name: str
    description: str = ""
    priority: int = 0
    targets: list[TargetName] = Field(default_factory=lambda: list(TARGET_NAMES), min_length=1)
    # Bounded: the matcher's work grows with the pattern (the largest built-in has 19
    # nodes and 12 constraints).
    nodes: list[NodeSpec] = Field(min_length=1, max_length=MAX_PATTERN_NODES)
    constraints: list[Constraint] = Field(default_factory=list, max_length=MAX_CONSTRAINTS)
    rewriter: RewriterRef
    cost_hints: CostHints | None = None
    # The fused op must stay in fp32 when the rest of the model runs in fp16
    # (normalizations: their variance and sums leave fp16's range or precision first).
    # Reported as a block list for fp16 conversion; never flagged as a range problem.
    keep_fp32: bool = False
    explain: ExplainSpec | None = None
    # Outputs of the pattern's nodes (``add.out0``) that the rewriter hands back with a
    # value of its own (a SkipLayerNormalization's sum), so that nodes outside the match
    # may still read them: no escape. The rewriter must replace each (``missing_output``).
    exposes: list[str] = Field(default_factory=list, max_length=8)
    # Built on first use: the plain variants of a pattern with optional groups, and for a
    # variant the groups it holds (the cost profile may price one group: "attention+softcap").
    _variants: list[PatternSpec] | None = PrivateAttr(default=None)
    _groups: tuple[str, ...] = PrivateAttr(default=())

    @field_validator("name")
    @classmethod
    def _dotted_name(cls, name: str) -> str:
        if not _NAME_RE.match(name):
            raise ValueError(
                f"{name!r} is not a pattern name: use letters, digits and _, dots between parts"
            )
        return name

    @model_validator(mode="after")
    def _graph_is_well_formed(self) -> PatternSpec:
        ids = [n.id for n in self.nodes]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"nodes: duplicate node id(s) {duplicates}")
        known = set(ids)
        for k, node in enumerate(self.nodes):
            for index, source in node.inputs.items():
                ref = parse_edge(source)
                if ref.node is not None and ref.node not in known:
                    raise ValueError(
                        f"nodes.{k}.inputs.{index}: {source!r} names no node of this pattern"
                    )
        for k, constraint in enumerate(self.constraints):
            try:
                refs = constraint_ref_nodes(constraint)
            except ValueError as exc:
                raise ValueError(f"constraints.{k}: {exc}") from None
            for text, node_id in refs:
                if node_id is not None and node_id not in known:
                    raise ValueError(f"constraints.{k}: {text!r} names no node of this pattern")
                ref = parse_ref(text)
                if ref.kind == "free" and ref.name not in self.free_inputs():
                    raise ValueError(f"constraints.{k}: {text!r} is not a free input of a node")
        if self.explain is not None and self.explain.node not in known:
            raise ValueError(f"explain.node: {self.explain.node!r} names no node of this pattern")
        for k, text in enumerate(self.exposes):
            ref = parse_ref(text)
            if ref.kind != "out" or ref.node not in known:
                raise ValueError(
                    f"exposes.{k}: {text!r} is not an output of a node of this pattern "
                    "(write node.out<k>)"
                )
        _check_acyclic(self.nodes)
        _check_connected(self.nodes)
        check_optional_groups(self)
        return self

    def variants(self) -> list[PatternSpec]:
        """The plain patterns this one stands for: itself, or one per subset of its
        optional groups, the most nodes first (``_optional.py``)."""
        if self._variants is None:
            self._variants = pattern_variants(self)
        return self._variants

    @property
    def groups(self) -> tuple[str, ...]:
        """The optional groups this variant holds (none for a pattern without any)."""
        return self._groups

    def node(self, node_id: str) -> NodeSpec:
        for node in self.nodes:
            if node.id == node_id:
                return node
        raise KeyError(node_id)

    def free_inputs(self) -> set[str]:
        return {
            parse_edge(s).name
            for n in self.nodes
            for s in n.inputs.values()
            if parse_edge(s).kind == "free"
        }

    def internal_edges(self) -> set[tuple[str, int]]:
        """(producer id, output index) of every output consumed inside the pattern and
        not exposed: the values no node outside the match may read."""
        edges = set()
        for node in self.nodes:
            for source in node.inputs.values():
                ref = parse_edge(source)
                if ref.node is not None:
                    edges.add((ref.node, ref.index))
        exposed = {(r.node, r.index) for r in map(parse_ref, self.exposes)}
        return edges - exposed


def _check_acyclic(nodes: list[NodeSpec]) -> None:
    """Depth-first, with an explicit stack: a long chain of nodes cannot overflow it."""
    deps = {n.id: sorted({parse_edge(s).node for s in n.inputs.values()} - {None}) for n in nodes}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in deps:
        if state.get(root):
            continue
        state[root] = 1
        stack = [(root, iter(deps[root]))]
        while stack:
            node_id, pending = stack[-1]
            dep = next(pending, None)
            if dep is None:
                state[node_id] = 2
                stack.pop()
            elif state.get(dep) == 1:
                raise ValueError(f"nodes: the edges form a cycle through {dep!r}")
            elif dep not in state:
                state[dep] = 1
                stack.append((dep, iter(deps[dep])))


def _check_connected(nodes: list[NodeSpec]) -> None:
    """Nodes must be linked by edges or shared free inputs; else matches multiply."""
    links: dict[str, set[str]] = defaultdict(set)
    for n in nodes:
        for source in n.inputs.values():
            ref = parse_edge(source)
            other = ref.node if ref.node is not None else f"${ref.name}"
            links[n.id].add(other)
            links[other].add(n.id)
    seen, todo = set(), [nodes[0].id]
    while todo:
        current = todo.pop()
        if current not in seen:
            seen.add(current)
            todo.extend(links[current] - seen)
    missing = [n.id for n in nodes if n.id not in seen]
    if missing:
        raise ValueError(
            f"nodes: {missing} are not connected to {nodes[0].id!r} by an edge or a shared "
            "free input"
        )


def _is_onnx_op(op_type: str) -> bool:
    """Whether onnx's schemas know the op. onnx is imported on the first check, not with
    this module: the API imports the pattern models at start and loads no onnx there."""
    import onnx.defs

    return onnx.defs.has(op_type)
