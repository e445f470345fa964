"""Pre-passes: make the graph say what it computes before patterns look at it.

Exporters hide constants behind Identity, Constant, Shape/Expand and CastLike chains
(the dynamo exporter builds every missing Conv bias at run time from the weight's
shape), and old models list their initializers as graph inputs. After these passes a
pattern sees plain constant initializers and inferred shapes.

Constant folding is onnxscript's (with size limits, so a pre-pass never materialises a
huge tensor); identity and unused-node elimination, lifting Constant nodes and shape
inference are onnx-ir's passes. Our own code here is only what those do not do:
treating IR<4 initializer-inputs as constants and removing inference-mode Dropout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.optimizer import fold_constants

from fusion_core.ir import constant_array

__all__ = ["PrepassOptions", "run_prepasses"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepassOptions:
    fold_constants: bool = True
    # Elements, not bytes. The output limit fits the largest conv/linear weights of
    # common CNNs (ResNet-50's fc is 2M) without materialising giant embedding tables.
    fold_input_size_limit: int = 1 << 22
    fold_output_size_limit: int = 1 << 23
    shape_inference: bool = True


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


def _fold_constant_of_shape(node: ir.Node) -> bool | None:
    # onnxscript keeps ConstantOfShape to keep files small, but weights written as
    # ConstantOfShape (as in the ONNX model zoo's light models) must become constants
    # for BatchNorm folding. The output size limit still bounds what is materialised.
    if node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx"):
        return True
    return None


def run_prepasses(model: ir.Model, options: PrepassOptions) -> list[str]:
    """Run the pre-passes in place; return the names of those that changed the model."""
    changed = []

    def run(name: str, pass_: ir.passes.PassBase) -> None:
        if pass_(model).modified:
            changed.append(name)

    run("initializer_inputs", InitializerInputsToConstantsPass())
    run("dropout_elimination", DropoutEliminationPass())
    run("identity_elimination", common.IdentityEliminationPass())
    if options.fold_constants:
        result = fold_constants(
            model,
            onnx_shape_inference=options.shape_inference,
            input_size_limit=options.fold_input_size_limit,
            output_size_limit=options.fold_output_size_limit,
            should_fold=_fold_constant_of_shape,
        )
        if result.modified:
            changed.append("constant_folding")
        run(
            "lift_constants",
            common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        )
        run("identity_elimination", common.IdentityEliminationPass())
    run("remove_unused", common.RemoveUnusedNodesPass())
    # Constant folding already infers every node's output shape as it walks the graph.
    # Only without it run onnx-ir's whole-graph pass (quadratic in the number of
    # initializers in onnx-ir 1.1: docs/benchmarks.md).
    if options.shape_inference and not options.fold_constants:
        try:
            run("shape_inference", common.ShapeInferencePass(strict_mode=False))
        except Exception as exc:  # inference is best effort, never fatal
            logger.warning("shape inference failed, continuing without it: %s", exc)
    run("topological_sort", common.TopologicalSortPass())
    return changed
