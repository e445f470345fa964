"""The local check of one step (a rewrite, a canonical rule, a pre-pass): what it emitted
must be a graph the runtime can load.

Run after every step, on the nodes that step wrote, so a step that breaks the graph is
caught (and rolled back alone) where it happened instead of surfacing as a failed check,
or a crash, rounds later:

* every op exists in the model's opset imports at that version, with only attributes
  its schema declares, every required one set, and a number of inputs and outputs the
  schema allows (``onnx.defs``; for the onnxruntime target onnxruntime's own registry,
  which adds its contrib ops and its own registrations of standard ops);
* the types and ranks infer: onnx's inference of the node, on the types of what it
  reads, agrees with the element type and rank the graph declares for its outputs;
* the graph has no cycle (``cycle_members``: the nodes on one, for naming the culprit).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

import onnx
import onnx_ir as ir

__all__ = ["cycle_members", "emitted_problems"]

_STANDARD = ("", "ai.onnx")
_SMALL_CONSTANT = 64  # elements: a Reshape target, an axes list; what inference reads


def emitted_problems(nodes: Iterable[ir.Node], model: ir.Model, *, target: str) -> list[str]:
    """Why ``nodes`` (what one step wrote into ``model``) cannot stay, as sentences;
    empty when they can."""
    problems: list[str] = []
    inferred: dict[str, onnx.TypeProto] = {}  # what earlier nodes of the step compute
    for node in nodes:
        problem = _schema_problem(node, model, target) or _inference_problem(node, model, inferred)
        if problem:
            problems.append(f"{node.op_type} {node.name!r}: {problem}")
    return problems


def cycle_members(graph: ir.Graph) -> set[int]:
    """``id`` of every node of ``graph`` that lies on a cycle (Tarjan's strongly connected
    components, iteratively: a graph of 100k nodes would overflow Python's stack)."""
    nodes = list(graph)
    members = {id(n) for n in nodes}
    successors: dict[int, list[ir.Node]] = {}
    for node in nodes:
        readers = [u.node for v in node.outputs for u in v.uses() if id(u.node) in members]
        successors[id(node)] = readers
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[ir.Node] = []
    on_stack: set[int] = set()
    cyclic: set[int] = set()
    counter = 0
    for root in nodes:
        if id(root) in index:
            continue
        work = [(root, 0)]
        while work:
            node, child = work.pop()
            key = id(node)
            if child == 0:
                index[key] = low[key] = counter
                counter += 1
                stack.append(node)
                on_stack.add(key)
            following = successors[key]
            if child < len(following):
                work.append((node, child + 1))
                nxt = following[child]
                if id(nxt) not in index:
                    work.append((nxt, 0))
                elif id(nxt) in on_stack:
                    low[key] = min(low[key], index[id(nxt)])
                continue
            for nxt in following:  # children done: take their lows
                if id(nxt) in on_stack:
                    low[key] = min(low[key], low[id(nxt)])
            if low[key] == index[key]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(id(top))
                    component.append(top)
                    if top is node:
                        break
                if len(component) > 1 or node in successors[key]:
                    cyclic.update(id(n) for n in component)
    return cyclic


def _schema_problem(node: ir.Node, model: ir.Model, target: str) -> str | None:
    domain = "" if node.domain in _STANDARD else node.domain
    imports = model.opset_imports
    version = imports.get(domain, imports.get("ai.onnx")) if domain == "" else imports.get(domain)
    if (domain, node.op_type, node.overload) in model.functions:
        return None  # a model-local function (fused_region): its body is checked as nodes
    if version is None:
        return f"its domain {domain!r} is not among the model's opset imports"
    schema = _schema(node.op_type, domain, version, target)
    if schema is None:
        if domain not in _STANDARD and not _registry_knows(domain, target):
            return None  # a domain neither onnx nor onnxruntime describes: the runtime's own
        return f"no op {node.op_type} in domain {domain or 'ai.onnx'!r} at opset {version}"
    declared = schema.attributes
    unknown = sorted(set(node.attributes) - set(declared))
    if unknown:
        return (
            f"attribute(s) {unknown} do not exist for {node.op_type} at opset {version} "
            f"(it has {sorted(declared)})"
        )
    missing = sorted(n for n, a in declared.items() if a.required and n not in node.attributes)
    if missing:
        return f"required attribute(s) {missing} not set"
    inputs, outputs = len(node.inputs), len(node.outputs)
    if not schema.min_input <= inputs <= schema.max_input:
        return f"{inputs} input(s); opset {version} takes {schema.min_input} to {schema.max_input}"
    if not schema.min_output <= outputs <= schema.max_output:
        return (
            f"{outputs} output(s); opset {version} gives {schema.min_output} to {schema.max_output}"
        )
    return None


def _inference_problem(
    node: ir.Node, model: ir.Model, inferred: dict[str, onnx.TypeProto]
) -> str | None:
    """onnx's type and shape inference of ``node`` alone, against what the graph says;
    an input the graph has no type for takes what ``inferred`` (the step's earlier
    nodes) found, and this node's outputs go into it."""
    domain = "" if node.domain in _STANDARD else node.domain
    if domain != "" or any(a.type in _GRAPH_ATTRS for a in node.attributes.values()):
        return None  # contrib ops have no onnx schema; a body needs its outer scope
    version = model.opset_imports.get("", model.opset_imports.get("ai.onnx"))
    try:
        schema = onnx.defs.get_schema(node.op_type, version, "")
    except onnx.defs.SchemaError:
        return None  # onnxruntime's own registration (LayerNormalization below 17)
    types, data = {}, {}
    for value in node.inputs:
        if value is None:
            continue
        if value.name and value.type is None and value.name in inferred:
            types[value.name] = inferred[value.name]
            continue
        if not value.name or value.type is None:
            return None  # what it reads is not typed yet: nothing to infer from
        types[value.name] = ir.serde.serialize_value(value).type
        const = value.const_value
        if const is not None and const.size <= _SMALL_CONSTANT:
            data[value.name] = ir.serde.serialize_tensor(const)
    try:
        outputs = onnx.shape_inference.infer_node_outputs(
            schema,
            ir.serde.serialize_node(node),
            types,
            data,
            opset_imports=[onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items()],
        )
    except Exception as exc:  # InferenceError and schema errors: what they say is the point
        return f"types do not infer: {str(exc).strip().splitlines()[0]}"
    for value in node.outputs:
        found = outputs.get(value.name or "")
        if found is None or not found.HasField("tensor_type"):
            continue
        inferred[value.name or ""] = found
        tensor = found.tensor_type
        if value.dtype is not None and tensor.elem_type and tensor.elem_type != value.dtype.value:
            onnx_name = onnx.TensorProto.DataType.Name(tensor.elem_type)
            return f"output {value.name!r} infers as {onnx_name}, the graph says {value.dtype.name}"
        inferred_rank = len(tensor.shape.dim) if tensor.HasField("shape") else None
        if value.shape is not None and inferred_rank not in (None, len(value.shape)):
            return (
                f"output {value.name!r} infers with rank {inferred_rank}, "
                f"the graph says {len(value.shape)}"
            )
    return None


_GRAPH_ATTRS = (ir.AttributeType.GRAPH, ir.AttributeType.GRAPHS)


def _schema(op_type: str, domain: str, version: int, target: str):
    """The schema ``op_type`` has at ``version`` for the target's runtime, or None."""
    if target == "onnxruntime":
        by_version = _onnxruntime_schemas().get((domain, op_type))
        if by_version is not None:
            since = [v for v in by_version if v <= version]
            return by_version[max(since)] if since else None
        if _onnxruntime_schemas():
            return None
    try:
        return onnx.defs.get_schema(op_type, version, domain)
    except onnx.defs.SchemaError:
        return None


def _registry_knows(domain: str, target: str) -> bool:
    if domain in _STANDARD or domain == "ai.onnx.ml":
        return True
    if target != "onnxruntime":
        return False
    return any(d == domain for d, _ in _onnxruntime_schemas())


@functools.cache
def _onnxruntime_schemas() -> dict[tuple[str, str], dict[int, object]]:
    """onnxruntime's registry, (domain, op) -> since_version -> schema; empty where the
    build does not expose it (then onnx's schemas stand in)."""
    try:
        from onnxruntime.capi import onnxruntime_pybind11_state as state

        listed = state.get_all_operator_schema()
    except Exception:  # a build without the schema registry
        return {}
    schemas: dict[tuple[str, str], dict[int, object]] = {}
    for schema in listed:
        domain = "" if schema.domain in _STANDARD else schema.domain
        schemas.setdefault((domain, schema.name), {})[schema.since_version] = schema
    return schemas
