"""Whole-graph shape inference as a pass: inferred shapes fill in what the model lacks.

Run after constant folding, whose per-node inference loses the symbolic dims a graph
computes at run time; a whole-graph inference with data propagation keeps them. The
inferences themselves (onnxruntime's symbolic one where it is safe and fast, onnx's)
are ``_inferences.py``; here they are merged into the model, by value name, without
overwriting what it already knows.
"""

from __future__ import annotations

from collections import Counter

import onnx
import onnx_ir as ir

from autofusion.fusion_core.prepasses._inferences import inferred_models

__all__ = ["SymbolicShapeInferencePass"]


class SymbolicShapeInferencePass(ir.passes.InPlacePass):
    """onnx's shape inference with data propagation over the whole graph, in linear time.

    Large initializers, and those left in external data, are handed to onnx as typed
    inputs without data (the model's inputs and initializers are restored before
    returning); the inferred shapes fill in the dims the model does not know yet, by
    value name. Known dims are never
    overwritten, and a failure of the inference leaves the model as it was: shapes are
    best effort, never fatal.
    """

    def __init__(self, *, initializer_limit: int = 1024) -> None:
        super().__init__()
        self.initializer_limit = initializer_limit

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        proto = self._proto_without_large_initializers(model)
        modified = False
        inferences = inferred_models(model.graph, proto)
        values = _values_named_once(model.graph)
        for inferred in inferences:
            if inferred is None:
                continue
            types = {info.name: info.type for info in inferred.graph.value_info}
            types.update((info.name, info.type) for info in inferred.graph.output)
            for value in values:
                if value.name in types:
                    modified |= _merge_type(value, types[value.name])
        return ir.passes.PassResult(model, modified=modified)

    def _proto_without_large_initializers(self, model: ir.Model) -> onnx.ModelProto:
        graph = model.graph
        everything = list(graph.initializers.values())
        # Tensors left in external data go as inputs too, whatever their size: the
        # inferences cannot read them (their location is relative to the model's folder,
        # not to this process's), and onnxruntime's fails on the first one it tries to.
        large = [
            v
            for v in everything
            if v.const_value is None
            or v.const_value.size > self.initializer_limit
            or isinstance(v.const_value, ir.ExternalTensor)
        ]
        input_count = len(graph.inputs)
        input_names = {v.name for v in graph.inputs}
        try:
            for value in large:
                if value.const_value is not None:
                    value.shape = value.shape or value.const_value.shape
                    value.dtype = value.dtype or value.const_value.dtype
                graph.initializers.pop(value.name)
                if value.name not in input_names:
                    # A stand-in of the same name, type and shape, not the value itself:
                    # onnx-ir's graph inputs count every value they ever held and keep
                    # it (its weights and their mapping of the data file) for the graph's
                    # life, long after a rewrite has replaced it.
                    graph.inputs.append(
                        ir.Value(name=value.name, type=value.type, shape=value.shape)
                    )
            return ir.serde.serialize_model(model)
        finally:
            # Restore inputs and initializers exactly, in their original order. Only the
            # containers' own methods keep a value's bookkeeping right: a slice ``del``
            # on graph.inputs would leave the flag behind, so ``is_graph_input()`` would
            # stay True and every large weight would read as an overridable default.
            while len(graph.inputs) > input_count:
                graph.inputs.pop()
            graph.initializers.clear()
            for value in everything:
                graph.initializers.add(value)


def _values_named_once(graph: ir.Graph) -> list[ir.Value]:
    """Node outputs of ``graph`` and its subgraphs whose name no other value shares.

    The inferred types come back by name, and the two branches of an ``If`` often
    define values of the same name with different shapes (silero-vad's LSTM input is
    rank 3 in one branch, rank 2 in the other): such a name says nothing reliable.
    """
    values = [v for node in ir.traversal.RecursiveGraphIterator(graph) for v in node.outputs]
    counts = Counter(v.name for v in values)
    return [v for v in values if counts[v.name] == 1]


def _merge_type(value: ir.Value, type_proto: onnx.TypeProto) -> bool:
    """Fill in what ``value`` does not know from an inferred type; True if it changed."""
    modified = False
    if value.type is None:
        inferred_type = ir.serde.deserialize_type_proto_for_type(type_proto)
        if inferred_type is not None:
            value.type = inferred_type
            modified = True
    shape = ir.serde.deserialize_type_proto_for_shape(type_proto)
    if shape is None:
        return modified
    if value.shape is None:
        value.shape = shape
        return True
    if len(value.shape) != len(shape):
        return modified  # a conflict: keep what the model says
    dims = [_better_dim(old, new) for old, new in zip(value.shape, shape, strict=True)]
    if dims != list(value.shape):
        value.shape = ir.Shape(dims)
        modified = True
    return modified


def _better_dim(old: int | ir.SymbolicDim, new: int | ir.SymbolicDim) -> int | ir.SymbolicDim:
    """A known dim beats a symbol, a named symbol beats an unknown one; ties keep ``old``."""
    if isinstance(old, int):
        return old
    if isinstance(new, int) or (_unknown(old) and not _unknown(new)):
        return new
    return old


def _unknown(dim: ir.SymbolicDim) -> bool:
    # onnx's inference names the dims it cannot relate to anything "unk__<n>"
    return dim.value is None or dim.value.startswith("unk__")
