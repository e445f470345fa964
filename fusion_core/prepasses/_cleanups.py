"""Cleanups before folding: what onnx-ir's own passes do not do, or do wrong for us.

Old models list their initializers as graph inputs (IR < 4), where they are constants;
an inference-mode Dropout is the identity; and an Identity copy hides the value a
pattern would match. These passes turn each into the plain graph a pattern expects.
"""

from __future__ import annotations

import onnx_ir as ir

from autofusion.fusion_core.ir import constant_array

__all__ = [
    "DropoutEliminationPass",
    "IdentityEliminationPass",
    "InitializerInputsToConstantsPass",
]


class InitializerInputsToConstantsPass(ir.passes.InPlacePass):
    """IR < 4 requires every initializer to be listed as a graph input; there they are
    constants, not overridable defaults, so drop them from the inputs (and move the
    model to IR 4, where the distinction exists)."""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        if model.ir_version >= 4:
            return ir.passes.PassResult(model, modified=False)
        graph = model.graph
        kept = [v for v in graph.inputs if v.name not in graph.initializers]
        modified = len(kept) != len(graph.inputs)
        graph.inputs[:] = kept
        model.ir_version = 4
        return ir.passes.PassResult(model, modified=modified or True)


class DropoutEliminationPass(ir.passes.InPlacePass):
    """In inference a Dropout is the identity (when not forced into training mode and
    its mask is unused): https://onnx.ai/onnx/operators/onnx__Dropout.html"""

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        modified = False
        for node in list(model.graph):
            if node.op_type != "Dropout" or node.domain not in ("", "ai.onnx"):
                continue
            if len(node.outputs) > 1 and node.outputs[1].uses():
                continue
            if node.outputs[1:] and node.outputs[1].is_graph_output():
                continue
            training = node.inputs[2] if len(node.inputs) > 2 else None
            if training is not None:
                flag = constant_array(training)
                if flag is None or bool(flag.reshape(-1)[0]):
                    continue
            identity = ir.Node("", "Identity", [node.inputs[0]], name=node.name)
            ir.convenience.replace_nodes_and_values(
                model.graph, node, [node], [identity], [node.outputs[0]], [identity.outputs[0]]
            )
            modified = True
        return ir.passes.PassResult(model, modified=modified)


class IdentityEliminationPass(ir.passes.InPlacePass):
    """Remove ``y = Identity(x)`` wherever that keeps every graph's outputs, in every graph.

    onnx-ir's own pass (1.1) renames ``x`` to ``y`` when ``y`` is a graph output, which
    breaks two things it does not look at: a ``Scan`` body that returns both the carried
    sum ``x`` and its copy ``y`` (the body then returns one value twice and the first
    output loses its name: the ONNX node test ``test_scan_sum`` computed ``[1e-45, 0]``
    instead of ``[9, 12]``), and a branch of ``If`` whose output copies a value of the
    outer graph (the rename raises "already an output of a different graph"). So an
    Identity that produces a graph output is removed only when ``x`` is made by a node of
    the same graph and is no graph's input, initializer or output; other copies stay.
    """

    def call(self, model: ir.Model) -> ir.passes.PassResult:
        graphs = [model.graph, *model.functions.values()]
        nodes = [n for g in graphs for n in ir.traversal.RecursiveGraphIterator(g)]
        modified = False
        for node in nodes:
            if _is_identity(node) and node.graph is not None:
                modified |= _eliminate_identity(node)
        return ir.passes.PassResult(model, modified=modified)


def _is_identity(node: ir.Node) -> bool:
    return (
        node.op_type == "Identity"
        and node.domain in ("", "ai.onnx")
        and len(node.inputs) == 1
        and len(node.outputs) == 1
        and node.inputs[0] is not None
    )


def _eliminate_identity(node: ir.Node) -> bool:
    source, copy = node.inputs[0], node.outputs[0]
    graph = node.graph
    if copy.is_graph_output():
        producer = source.producer()
        if (
            producer is None
            or producer.graph is not graph
            or source.is_graph_output()
            or source.is_graph_input()
            or source.is_initializer()
        ):
            return False
    if source.type is None:
        source.type = copy.type
    if source.shape is None:
        source.shape = copy.shape
    was_output = copy.is_graph_output()
    ir.convenience.replace_all_uses_with(copy, source, replace_graph_outputs=True)
    if was_output:
        source.name = copy.name
    graph.remove(node, safe=True)
    return True
