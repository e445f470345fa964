"""``fused_region``: the universal fallback. The matched nodes move into a model-local
ONNX function (https://onnx.ai/onnx/repo-docs/IR.html#functions) in a custom domain,
and one call of that function replaces them in the graph.

A vendor runtime sees one fused op (``domain::op_type``) it can map to its own kernel;
onnxruntime inlines the function, so the result still runs (and validates) anywhere.
This is how a pattern registered at run time, with no rewriter of its own, still fuses.

Function inputs are the values the region reads from outside (initializers included,
since a function body cannot see the graph's initializers); function outputs are the
region's values that are read outside or are graph outputs. Regions of one pattern with
identical bodies share one function; different bodies get distinct ``overload``s.
"""

from __future__ import annotations

import re

import onnx_ir as ir
from pydantic import Field, field_validator

from autofusion.fusion_core.patterns import Match
from autofusion.fusion_core.rewriters._base import (
    Params,
    Rewrite,
    RewriteContext,
    Rewriter,
    copy_attributes,
)

__all__ = ["FusedRegion", "default_op_type"]

# Functions with overloads need IR version 10 (ONNX 1.16).
_FUNCTION_IR_VERSION = 10
_RESERVED_DOMAINS = ("", "ai.onnx", "ai.onnx.ml", "com.microsoft")


def default_op_type(pattern_name: str) -> str:
    """``vision.conv_bn_relu`` -> ``ConvBnRelu``."""
    last = pattern_name.rsplit(".", 1)[-1]
    return "".join(part[:1].upper() + part[1:] for part in last.split("_") if part) or "Fused"


class FusedRegionParams(Params):
    domain: str = Field(default="ai.autofusion", min_length=1)
    op_type: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")

    @field_validator("domain")
    @classmethod
    def _custom_domain(cls, domain: str) -> str:
        if domain in _RESERVED_DOMAINS or not re.match(r"^[A-Za-z0-9_.\-]+$", domain):
            raise ValueError(
                f"{domain!r} is reserved or malformed: use your own, e.g. ai.mycompany"
            )
        return domain


class FusedRegion(Rewriter):
    name = "fused_region"
    Params = FusedRegionParams

    def rewrite(
        self, match: Match, params: FusedRegionParams, ctx: RewriteContext
    ) -> Rewrite | str:
        nodes = sorted(match.nodes.values(), key=lambda n: ctx.positions[id(n)])
        members = {id(n) for n in nodes}
        produced = {id(v) for n in nodes for v in n.outputs}
        outer_inputs: list[ir.Value] = []
        for node in nodes:
            for value in node.inputs:
                if value is not None and id(value) not in produced and value not in outer_inputs:
                    outer_inputs.append(value)
        outer_outputs = [
            v
            for n in nodes
            for v in n.outputs
            if v.is_graph_output() or any(id(u.node) not in members for u in v.uses())
        ]
        if not outer_outputs:
            return "the region computes nothing that is used outside it"
        op_type = params.op_type or default_op_type(match.pattern.name)
        overload = self._register_function(
            ctx, params.domain, op_type, nodes, outer_inputs, outer_outputs
        )
        call = ir.Node(
            params.domain,
            op_type,
            outer_inputs,
            overload=overload,
            num_outputs=len(outer_outputs),
        )
        return Rewrite([call], list(zip(outer_outputs, call.outputs, strict=True)))

    def _register_function(
        self,
        ctx: RewriteContext,
        domain: str,
        op_type: str,
        nodes: list[ir.Node],
        inputs: list[ir.Value],
        outputs: list[ir.Value],
    ) -> str:
        body = _clone_body(nodes, inputs, outputs)
        signature = _signature(body)
        model = ctx.model
        overloads = [key for key in model.functions if key[:2] == (domain, op_type)]
        for key in overloads:
            if _signature(model.functions[key].graph) == signature:
                return key[2]
        overload = f"v{len(overloads)}" if overloads else ""
        opsets = {d: v for d, v in model.opset_imports.items() if d != domain}
        body.opset_imports.update(opsets)
        function = ir.Function(domain, op_type, overload, graph=body, attributes=[])
        model.functions[function.identifier()] = function
        ctx.use_domain(domain)
        model.ir_version = max(model.ir_version, _FUNCTION_IR_VERSION)
        return overload


def _clone_body(nodes: list[ir.Node], inputs: list[ir.Value], outputs: list[ir.Value]) -> ir.Graph:
    """Copies of ``nodes`` reading fresh formal inputs, as a function body."""
    mapping: dict[int, ir.Value] = {}
    formals = []
    for k, value in enumerate(inputs):
        formal = ir.Value(name=f"in{k}", type=value.type, shape=value.shape)
        mapping[id(value)] = formal
        formals.append(formal)
    clones = []
    for node in nodes:
        clone = ir.Node(
            node.domain,
            node.op_type,
            [mapping[id(v)] if v is not None else None for v in node.inputs],
            copy_attributes(node),
            overload=node.overload,
            num_outputs=len(node.outputs),
            name=node.name,
        )
        for old, new in zip(node.outputs, clone.outputs, strict=True):
            new.name, new.type, new.shape = old.name, old.type, old.shape
            mapping[id(old)] = new
        clones.append(clone)
    return ir.Graph(formals, [mapping[id(v)] for v in outputs], nodes=clones, opset_imports={})


def _signature(graph: ir.Graph) -> str:
    """A structural fingerprint: ops, attributes and wiring, not value names."""
    index = {id(v): f"in{k}" for k, v in enumerate(graph.inputs)}
    parts = []
    for k, node in enumerate(graph):
        wiring = [index.get(id(v), "?") if v is not None else "-" for v in node.inputs]
        attrs = sorted((a.name, repr(a.value)) for a in node.attributes.values())
        parts.append(f"{node.domain}:{node.op_type}({','.join(wiring)}){attrs}")
        for j, out in enumerate(node.outputs):
            index[id(out)] = f"n{k}.{j}"
    parts.append("->" + ",".join(index.get(id(v), "?") for v in graph.outputs))
    return ";".join(parts)
