"""A pre-pass: read dimensions from the graph inputs, not from inner tensors.

The TorchScript exporter builds every Reshape target from ``Shape`` of the tensor at
hand (``Shape(context)[0]`` for the batch of an attention output), and the dynamo
exporter reads ``Shape(K)`` inside scaled-dot-product attention. Such a read makes the
inner tensor "escape" any fusion around it, although only its dimensions are used.

This pass replaces ``Shape(x)[start:end]`` by the same dimensions taken from where they
come from: a constant for a known size, ``Shape(input)[j:j+1]`` for dimension ``j`` of a
graph input. Each dimension must be proven by the graph's structure
(``fusion_core.sizes``: declared input dims, constants, Reshape and Expand targets read
from sizes, Range lengths, through the ops that keep or move an axis), never taken from
the symbol a shape inference put on ``x``: onnxruntime's symbolic inference merges
symbols it cannot compare (Kimi-Linear's sequence padded to a multiple of a chunk was
labelled ``sequence``), and a read of the padded length rewritten as the ids' length
computes with the wrong length wherever the padding is not zero. A read with any
dimension not proven so, or proven a size no graph input declares (``past + 1``),
stays as it is. Reads are proven in graph order with one ``SizeProof``, so a chain as
long as the model's layers is proven step by step.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from autofusion.fusion_core.patterns import attribute_value
from autofusion.fusion_core.sizes import Size, SizeProof, declared

__all__ = ["ShapeReadsFromInputsPass"]

_Source = int | tuple[ir.Value, int]  # a known size, or (graph input, axis)


class ShapeReadsFromInputsPass(ir.passes.InPlacePass):
    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graph = model.graph
        self._opset = model.opset_imports.get("", model.opset_imports.get("ai.onnx", 1))
        self._names = (
            {v.name for v in graph.initializers.values()}
            | {v.name for n in graph for v in n.outputs}
            | {v.name for v in graph.inputs}
        )
        symbols = _input_dims(graph)
        proof = SizeProof()
        shapes_of_inputs: dict[tuple[str, int], ir.Value] = {}
        modified = False
        for node in list(graph):
            if node.op_type != "Shape" or node.domain not in ("", "ai.onnx"):
                continue
            sources = _sources(node, symbols, proof)
            if sources is None:
                continue
            parts = self._parts(graph, node, sources, shapes_of_inputs)
            if len(parts) == 1:
                new = parts[0]
            else:
                concat = ir.Node("", "Concat", parts, [ir.AttrInt64("axis", 0)])
                graph.insert_before(node, concat)
                new = concat.outputs[0]
            new.dtype = ir.DataType.INT64
            new.shape = ir.Shape([len(sources)])
            old = node.outputs[0]
            if old.is_graph_output():
                continue  # keep graph outputs produced by their own node
            old.replace_all_uses_with(new)
            graph.remove(node, safe=True)
            modified = True
        return ir.passes.PassResult(model, modified=modified)

    def _fresh(self, hint: str) -> str:
        name, k = hint, 1
        while name in self._names:
            name, k = f"{hint}_{k}", k + 1
        self._names.add(name)
        return name

    def _parts(
        self,
        graph: ir.Graph,
        node: ir.Node,
        sources: list[_Source],
        shapes_of_inputs: dict[tuple[str, int], ir.Value],
    ) -> list[ir.Value]:
        """1-D int64 values that concatenate to the dims: runs of sizes as one constant."""
        parts: list[ir.Value] = []
        sizes: list[int] = []

        def flush() -> None:
            if sizes:
                array = np.array(sizes, dtype=np.int64)
                value = ir.Value(
                    name=self._fresh(f"{node.name or 'shape'}_dims"),
                    shape=ir.Shape(array.shape),
                    const_value=ir.tensor(array),
                )
                value.dtype = ir.DataType.INT64
                graph.register_initializer(value)
                parts.append(value)
                sizes.clear()

        for source in sources:
            if isinstance(source, int):
                sizes.append(source)
                continue
            flush()
            value, axis = source
            key = (value.name or "", axis)
            if key not in shapes_of_inputs:
                reads = self._read_dim(graph, value, axis)
                # at the top of the graph, so every later read can share it
                graph.insert_before(next(iter(graph)), reads)
                shapes_of_inputs[key] = reads[-1].outputs[0]
            parts.append(shapes_of_inputs[key])
        flush()
        return parts

    def _read_dim(self, graph: ir.Graph, value: ir.Value, axis: int) -> list[ir.Node]:
        """``Shape(value)[axis:axis + 1]``: Shape's start and end from opset 15, a Gather
        of the whole shape before (the model's own opset: never an op it lacks)."""
        if self._opset >= 15:
            attributes = [ir.AttrInt64("start", axis), ir.AttrInt64("end", axis + 1)]
            reads = [ir.Node("", "Shape", [value], attributes)]
        else:
            shape = ir.Node("", "Shape", [value])
            shape.outputs[0].name = self._fresh(f"{value.name}_shape")
            shape.outputs[0].dtype = ir.DataType.INT64
            shape.outputs[0].shape = ir.Shape([len(value.shape or ())])
            index = ir.Value(
                name=self._fresh(f"{value.name}_axis{axis}"),
                shape=ir.Shape([1]),
                const_value=ir.tensor(np.array([axis], dtype=np.int64)),
            )
            index.dtype = ir.DataType.INT64
            graph.register_initializer(index)
            gather = ir.Node("", "Gather", [shape.outputs[0], index], [ir.AttrInt64("axis", 0)])
            reads = [shape, gather]
        out = reads[-1].outputs[0]
        out.name = self._fresh(f"{value.name}_dim{axis}")
        out.dtype = ir.DataType.INT64
        out.shape = ir.Shape([1])
        return reads


def _input_dims(graph: ir.Graph) -> dict[Size, tuple[ir.Value, int]]:
    """Each size a graph input declares, and the first (input, axis) that declares it."""
    dims: dict[Size, tuple[ir.Value, int]] = {}
    for value in graph.inputs:
        if value.shape is None:
            continue
        for axis, dim in enumerate(value.shape):
            size = declared(dim, f"{value.name}[{axis}]")
            if size.atoms:
                dims.setdefault(size, (value, axis))
    return dims


def _sources(
    node: ir.Node, dims: dict[Size, tuple[ir.Value, int]], proof: SizeProof
) -> list[_Source] | None:
    """Where each dimension read by this Shape comes from, or None if any is not proven
    to be a number or a graph input's declared dimension."""
    x = node.inputs[0]
    if x is None or x.is_graph_input() or x.shape is None or x.const_value is not None:
        return None
    rank = len(x.shape)
    start = _clamp(attribute_value(node, "start", 0), rank)
    end = _clamp(attribute_value(node, "end", rank), rank)
    sources: list[_Source] = []
    for axis in range(start, end):
        size = proof.size(x, axis)
        if size is None:
            return None
        if size.value is not None:
            sources.append(size.value)
        elif size in dims:
            sources.append(dims[size])
        else:
            return None
    return sources or None


def _clamp(index: int | None, rank: int) -> int:
    if index is None:
        return rank
    if index < 0:
        index += rank
    return min(max(index, 0), rank)
