"""The region signature of a group of fusions: what a verdict is about, with no names.

A verdict (``fusion_core.profiling.verdicts``) transfers to another model when it fused
the same regions:
the same pattern in the same version (``pattern_hash``: the sha256 of its spec, so a
changed pattern is a new signature), emitting the same ops, with the same attributes,
dtypes and shape classes. Each fusion's region is described from the model the fusions
were applied to (the proposal, shapes inferred): its fused nodes' ``domain::op_type``,
attributes (tensor attributes as dtype and dims, with their values only up to 16
elements) and each input's and output's dtype and shape class. A fused node a later
round consumed (MultiHeadAttention packed into Attention) is described by the node that
consumed it; one gone without a trace by its op types.

A shape class keeps a verdict from transferring across sizes that time differently
while letting near sizes share it: symbolic dims take the sizes measured, and a dim is
exact up to 16, else the nearest power of two; a dim nobody knows is ``?``. Node and
tensor names never enter, nor weights: verdicts are shared across tenants.

The signature hashes the pattern, its hash, the fused ops and the *set* of distinct
region texts, not the number of fusions: a 12-layer and a 24-layer model of the same
blocks share it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.catalog import CompiledPattern
from autofusion.fusion_core.pipeline.measured._groups import FusionGroup
from autofusion.fusion_core.pipeline.result import AppliedFusion, Result
from autofusion.fusion_core.validate import evaluate_dim

__all__ = [
    "RegionSignature",
    "group_signature",
    "measured_dims",
    "pattern_hash",
    "pattern_hashes",
    "shape_class",
]

_VERSION = "autofusion-signature/1"
_SMALL = 16  # elements: a tensor attribute's values are part of the region up to this
_EXACT = 16  # dims up to this are exact, larger ones the nearest power of two
_LISTED = 64  # region texts a record lists (the signature covers all of them)
_TEXT = 1000  # characters of one listed region text


@dataclass(frozen=True)
class RegionSignature:
    """A group's signature (sha256 hex), its pattern's hash and the record's ``region``."""

    signature: str
    pattern_hash: str
    region: dict[str, Any]  # {"ops": [...], "fusions": N, "regions": [text, ...]}


def pattern_hash(spec: Any) -> str:
    """The sha256 of a pattern spec's canonical JSON (a ``PatternSpec``)."""
    text = json.dumps(spec.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def pattern_hashes(patterns: Iterable[CompiledPattern]) -> dict[str, str]:
    return {p.name: pattern_hash(p.spec) for p in patterns}


def shape_class(size: int) -> int:
    """Exact up to 16, else the nearest power of two."""
    return size if size <= _EXACT else 2 ** round(math.log2(size))


def measured_dims(
    model: ir.Model, sample: Mapping[str, np.ndarray], dims: Mapping[str, int]
) -> dict[str, int]:
    """The symbolic dims' sizes in the measurement: read from the sample's arrays (the
    user's inputs have no dims given), the timer's own ``dims`` winning."""
    found: dict[str, int] = {}
    for value in model.graph.inputs:
        array = sample.get(value.name or "")
        if array is None or value.shape is None or len(value.shape) != np.ndim(array):
            continue
        for dim, size in zip(value.shape, np.shape(array), strict=True):
            if isinstance(dim, ir.SymbolicDim) and dim.value:
                found[dim.value] = int(size)
    return {**found, **{k: int(v) for k, v in dims.items()}}


def group_signature(
    group: FusionGroup, proposal: Result, hashes: Mapping[str, str], dims: Mapping[str, int]
) -> RegionSignature:
    """The signature of ``group`` as ``proposal`` (the model its fusions were applied to)
    has its regions; ``hashes``: ``pattern_hashes`` of the run's patterns."""
    nodes = {n.name: n for n in ir.traversal.RecursiveGraphIterator(proposal.model.graph)}
    sizes = _Sizes(dims, proposal.inferred)
    texts = sorted({_region(f, nodes, proposal.applied, sizes) for f in group.fusions})
    ops = sorted(set(group.new_ops))
    phash = hashes.get(group.pattern) or hashlib.sha256(group.pattern.encode()).hexdigest()
    payload = json.dumps([_VERSION, group.pattern, phash, ops, texts], separators=(",", ":"))
    listed = [t if len(t) <= _TEXT else t[: _TEXT - 1] + "…" for t in texts[:_LISTED]]
    region = {"ops": ops, "fusions": len(group.fusions), "regions": listed}
    return RegionSignature(hashlib.sha256(payload.encode()).hexdigest(), phash, region)


@dataclass(frozen=True)
class _Sizes:
    """What a region's values are signed with: the measurement's dims, and the types and
    shapes the written model left out (``Result.inferred``)."""

    dims: Mapping[str, int]
    inferred: Mapping[str, tuple[Any, Any]]


def _region(
    fusion: AppliedFusion,
    nodes: Mapping[str, ir.Node],
    applied: Sequence[AppliedFusion],
    sizes: _Sizes,
) -> str:
    """One fusion's region: its fused nodes, or what consumed those a later round took."""
    present = sorted(_node(nodes[n], sizes) for n in fusion.new_nodes if n in nodes)
    text = " ; ".join(present)
    if len(present) == len(fusion.new_nodes):
        return text
    ops = ",".join(sorted(set(fusion.new_ops)))
    consumers = _consumers(fusion, nodes, applied)
    if consumers:
        inner = " ; ".join(sorted({_node(nodes[n], sizes) for n in consumers}))
        gone = f"{ops} consumed by {inner}"
    else:
        gone = f"{ops} gone"
    return f"{text} ; {gone}" if text else gone


def _consumers(
    fusion: AppliedFusion, nodes: Mapping[str, ir.Node], applied: Sequence[AppliedFusion]
) -> set[str]:
    """The nodes of the proposal that later fusions made out of ``fusion``'s nodes."""
    missing = {n for n in fusion.new_nodes if n not in nodes}
    found: set[str] = set()
    seen: set[int] = set()
    while missing:
        later = [
            (i, f)
            for i, f in enumerate(applied)
            if i not in seen and missing & set(f.replaced_nodes)
        ]
        if not later:
            break
        missing = set()
        for i, f in later:
            seen.add(i)
            found |= {n for n in f.new_nodes if n in nodes}
            missing |= {n for n in f.new_nodes if n not in nodes}
    return found


def _node(node: ir.Node, sizes: _Sizes) -> str:
    attrs = ",".join(f"{name}={_attr(node.attributes[name])}" for name in sorted(node.attributes))
    ins = ",".join(_value(v, sizes) for v in node.inputs)
    outs = ",".join(_value(v, sizes) for v in node.outputs)
    return f"{node.domain or 'ai.onnx'}::{node.op_type}({attrs})[{ins}]->[{outs}]"


def _value(value: ir.Value | None, sizes: _Sizes) -> str:
    if value is None:
        return "-"
    kind, shape = value.type, value.shape
    if kind is None and shape is None:
        kind, shape = sizes.inferred.get(value.name or "", (None, None))
    dtype = kind.dtype.name.lower() if kind is not None and kind.dtype is not None else "?"
    const = "c" if value.const_value is not None or value.is_initializer() else ""
    if shape is None:
        return f"{dtype}{const}"
    return f"{dtype}[{','.join(_dim(d, sizes.dims) for d in shape)}]{const}"


def _dim(dim: Any, dims: Mapping[str, int]) -> str:
    size = dim if isinstance(dim, int) else None
    if isinstance(dim, ir.SymbolicDim) and dim.value:
        size = evaluate_dim(dim.value, dims)
    return "?" if size is None else str(shape_class(size))


def _attr(attr: ir.Attr) -> str:
    if attr.is_ref():
        return f"@{attr.ref_attr_name}"
    kind, value = attr.type, attr.value
    if kind == ir.AttributeType.FLOAT:
        return f"{value:.6g}"
    if kind == ir.AttributeType.FLOATS:
        return "[" + ",".join(f"{v:.6g}" for v in value) + "]"
    if kind == ir.AttributeType.TENSOR:
        return _tensor(value)
    if kind == ir.AttributeType.TENSORS:
        return "[" + ",".join(_tensor(t) for t in value) + "]"
    if kind in (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS):
        graphs = value if kind == ir.AttributeType.GRAPHS else [value]
        return "[" + ",".join(_graph(g) for g in graphs) + "]"
    if kind in (ir.AttributeType.INT, ir.AttributeType.INTS, ir.AttributeType.STRING):
        return json.dumps(list(value) if kind == ir.AttributeType.INTS else value)
    if kind == ir.AttributeType.STRINGS:
        return json.dumps(list(value))
    return kind.name.lower()  # sparse tensors, type protos: their kind only


def _tensor(tensor: Any) -> str:
    shape = [int(d) for d in tensor.shape.numpy()] if tensor.shape is not None else []
    text = f"{tensor.dtype.name.lower()}{shape}"
    if math.prod(shape) > _SMALL:
        return text
    try:
        values = tensor.numpy().ravel().tolist()
    except Exception:  # a dtype numpy cannot show, or external data: dims are enough
        return text
    shown = [f"{v:.6g}" if isinstance(v, float) else v for v in values]
    return f"{text}={json.dumps(shown, default=repr)}"


def _graph(graph: ir.Graph) -> str:
    """A subgraph attribute: its ops, not its names."""
    ops = sorted({f"{n.domain or 'ai.onnx'}::{n.op_type}" for n in graph})
    return f"graph({len(graph)} nodes: {','.join(ops)})"
