"""The smallest model that reproduces a bug of ours: the region a rejected step worked
on, cut out of the model as an ONNX file of its own, for a user to attach to a report.

A rewrite that broke the graph (``transaction.py``) is about its match: the matched
nodes, as they were, with every value they read from outside as a graph input (small
constants stay constants, so the reproducer carries the shapes and scalars a rewriter
reads) and every value read outside as a graph output. The file holds no weights above
``WEIGHT_LIMIT`` elements: those become inputs with their type and shape, enough to
replay the rewrite.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Sequence

import onnx
import onnx.helper as oh
import onnx_ir as ir

__all__ = ["WEIGHT_LIMIT", "cut_region", "reproducer_names", "reproducers_zip"]

WEIGHT_LIMIT = 1 << 16  # elements: larger constants become typed inputs


def cut_region(model: ir.Model, nodes: Sequence[ir.Node]) -> onnx.ModelProto | None:
    """``nodes`` (of one graph) as a model of their own; None when they cannot be
    serialized (a body reading its outer scope, a value without a name)."""
    try:
        return _cut(model, nodes)
    except Exception:  # a reproducer is a courtesy: never a second failure
        return None


def _cut(model: ir.Model, nodes: Sequence[ir.Node]) -> onnx.ModelProto | None:
    inside = {id(n) for n in nodes}
    produced = {id(v) for n in nodes for v in n.outputs}
    inputs: list[onnx.ValueInfoProto] = []
    constants: list[onnx.TensorProto] = []
    seen: set[int] = set()
    for node in nodes:
        for value in node.inputs:
            if value is None or id(value) in produced or id(value) in seen:
                continue
            seen.add(id(value))
            const = value.const_value
            if const is not None and const.size <= WEIGHT_LIMIT:
                tensor = ir.serde.serialize_tensor(const)
                tensor.name = value.name or ""
                constants.append(tensor)
            else:
                inputs.append(ir.serde.serialize_value(value))
    outputs = [
        ir.serde.serialize_value(v)
        for n in nodes
        for v in n.outputs
        if v.is_graph_output() or any(id(u.node) not in inside for u in v.uses())
    ]
    if not outputs:
        outputs = [ir.serde.serialize_value(v) for v in nodes[-1].outputs]
    graph = oh.make_graph(
        [ir.serde.serialize_node(n) for n in nodes],
        "reproducer",
        inputs,
        outputs,
        constants,
    )
    opsets = [oh.make_opsetid(d, v) for d, v in model.opset_imports.items()]
    proto = oh.make_model(graph, opset_imports=opsets, producer_name="autofusion reproducer")
    proto.ir_version = model.ir_version
    used = {(n.domain, n.op_type) for n in nodes}
    for function in model.functions.values():  # a fused region's function, if it reads one
        if (function.domain, function.name) in used:
            proto.functions.append(ir.serde.serialize_function(function))
    return proto


def reproducer_names(rejected: Sequence) -> list[str | None]:
    """The file name of each rejection's reproducer in the zip (None: it has none):
    ``reproducer-<k>-<pattern>.onnx``, the name made safe for any file system."""
    names: list[str | None] = []
    for k, rejection in enumerate(rejected, start=1):
        if rejection.reproducer is None:
            names.append(None)
            continue
        safe = re.sub(r"[^A-Za-z0-9._-]+", "_", rejection.name)[:60]
        names.append(f"reproducer-{k}-{safe}.onnx")
    return names


def reproducers_zip(models: Sequence[tuple[str, onnx.ModelProto]]) -> bytes:
    """One zip of the reproducers, each by its name (``reproducer-1-<pattern>.onnx``)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, model in models:
            archive.writestr(name, model.SerializeToString())
    return buffer.getvalue()
