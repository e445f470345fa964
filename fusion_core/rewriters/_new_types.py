"""Types and shapes of the values a rewrite creates, written once for every rewriter
(``apply_rewrite`` calls ``type_new_values``).

Why: a later layer's rewrite reads sizes and labels from the values an earlier one left
(the guard of empty rows, the rows to keep, the lengths, a Reshape back to the merged
heads). A value with no type or shape there is a size that no rule reads and no label
names, so the next layer's proof and label fallback find nothing. A rewriter types the
values it replaces (``replace_nodes_and_values`` copies the old value's type and shape
onto its replacement) and its fused op's outputs; everything else is filled in here:

* a standard op (no subgraph): onnx's inference of that node alone
  (``onnx.shape_inference.infer_node_outputs``), from the types of what it reads and
  its small constant inputs, in the order the rewrite lists its nodes;
* an ``If``: its branches' values first, then each output from both branches' outputs
  (the dimensions they agree on, the rest unknown);
* an onnxruntime op that keeps its input's shape (a norm, the rotary, an activation):
  output 0 as input 0 (``_SAME_AS_INPUT``).

Only what is missing is written, and never a symbol the inference makes up: a dimension
named by no input of the node is left unknown, since two made-up names alike would say
two sizes are equal (the labels the fallback reads must not lie).
"""

from __future__ import annotations

from collections.abc import Iterable

import onnx
import onnx_ir as ir

__all__ = ["type_new_values"]

_STANDARD = ("", "ai.onnx")
_SMALL_CONSTANT = 1024  # elements of a constant input handed to the inference as data
_MS = "com.microsoft"
# onnxruntime ops whose output 0 is input 0's type and shape (their schemas' inference,
# which onnx does not have): norms, the rotary, activations
_SAME_AS_INPUT = frozenset(
    {
        (_MS, "RotaryEmbedding"),
        (_MS, "SkipLayerNormalization"),
        (_MS, "SkipSimplifiedLayerNormalization"),
        (_MS, "SimplifiedLayerNormalization"),
        (_MS, "BiasGelu"),
        (_MS, "FastGelu"),
        (_MS, "QuickGelu"),
        (_MS, "Gelu"),
        (_MS, "BiasSplitGelu"),
        ("", "SimplifiedLayerNormalization"),
    }
)


def type_new_values(nodes: Iterable[ir.Node], opset_imports: dict[str, int]) -> None:
    """Give each output of ``nodes`` (and of their subgraphs' nodes) the type and shape
    it is known to have where it has none; what a rewriter wrote stays."""
    opsets = [onnx.helper.make_opsetid(d, v) for d, v in opset_imports.items()]
    version = opset_imports.get("", opset_imports.get("ai.onnx", 1))
    for node in nodes:
        _type_node(node, version, opsets)


def _type_node(node: ir.Node, version: int, opsets: list) -> None:
    bodies = _bodies(node)
    for body in bodies:
        for inner in body:
            _type_node(inner, version, opsets)
    if all(_typed(v) for v in node.outputs):
        return
    if bodies and node.op_type == "If" and node.domain in _STANDARD:
        _from_branches(node, bodies)
    elif not bodies and node.domain in _STANDARD:
        _inferred(node, version, opsets)
    elif (node.domain, node.op_type) in _SAME_AS_INPUT and node.inputs and node.outputs:
        _fill(node.outputs[0], node.inputs[0].type if node.inputs[0] else None, _shape_of(node))


def _shape_of(node: ir.Node) -> ir.Shape | None:
    source = node.inputs[0]
    return ir.Shape(list(source.shape)) if source is not None and source.shape else None


def _typed(value: ir.Value) -> bool:
    return value.type is not None and value.shape is not None


def _fill(value: ir.Value, type_: ir.TypeProtocol | None, shape: ir.Shape | None) -> None:
    if value.type is None and type_ is not None:
        value.type = type_
    if value.shape is None and shape is not None:
        value.shape = shape


def _bodies(node: ir.Node) -> list[ir.Graph]:
    found = []
    for attr in node.attributes.values():
        if attr.type == ir.AttributeType.GRAPH:
            found.append(attr.as_graph())
        elif attr.type == ir.AttributeType.GRAPHS:
            found += list(attr.as_graphs())
    return found


def _from_branches(node: ir.Node, bodies: list[ir.Graph]) -> None:
    """An ``If``'s outputs: the type both branches give, the dimensions they agree on."""
    for index, value in enumerate(node.outputs):
        outs = [body.outputs[index] for body in bodies if index < len(body.outputs)]
        if len(outs) != 2 or outs[0].type is None or outs[0].type != outs[1].type:
            continue
        shapes = [o.shape for o in outs]
        shape = None
        if shapes[0] is not None and shapes[1] is not None and len(shapes[0]) == len(shapes[1]):
            shape = ir.Shape([a if a == b else None for a, b in zip(*shapes, strict=True)])
        _fill(value, outs[0].type, shape)


def _inferred(node: ir.Node, version: int, opsets: list) -> None:
    """onnx's inference of ``node`` alone, written where its outputs have nothing."""
    try:
        schema = onnx.defs.get_schema(node.op_type, version, "")
    except onnx.defs.SchemaError:
        return
    types, data, named = {}, {}, set()
    for value in node.inputs:
        if value is None:
            continue
        if not value.name or value.type is None:
            return  # what it reads is untyped (or unnamed): nothing to infer from
        proto = ir.serde.serialize_value(value)
        types[value.name] = proto.type
        named.update(d for d in value.shape or () if isinstance(d, ir.SymbolicDim) and d.value)
        const = value.const_value
        if const is not None and const.size <= _SMALL_CONSTANT:
            data[value.name] = ir.serde.serialize_tensor(const)
    names = {str(d.value) for d in named}
    proto_node = ir.serde.serialize_node(node)
    try:
        outputs = onnx.shape_inference.infer_node_outputs(
            schema, proto_node, types, data, opset_imports=opsets
        )
    except Exception:  # a node onnx cannot infer keeps what it had
        return
    for value in node.outputs:
        found = outputs.get(value.name or "")
        if found is None or not found.HasField("tensor_type") or not found.tensor_type.elem_type:
            continue
        tensor = found.tensor_type
        shape = None
        if tensor.HasField("shape"):
            shape = ir.Shape([_dim(d, names) for d in tensor.shape.dim])
        _fill(value, ir.TensorType(ir.DataType(tensor.elem_type)), shape)


def _dim(dim: onnx.TensorShapeProto.Dimension, names: set[str]) -> int | str | None:
    """A dimension as onnx inferred it: a number, a symbol an input of the node has, or
    unknown (a symbol the inference made up names nothing the graph says)."""
    if dim.HasField("dim_value"):
        return dim.dim_value
    if dim.HasField("dim_param") and dim.dim_param in names:
        return dim.dim_param
    return None
