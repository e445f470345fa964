"""Pre-passes: make the graph say what it computes before patterns look at it.

Exporters hide constants behind Identity, Constant, Shape/Expand and CastLike chains
(the dynamo exporter builds every missing Conv bias at run time from the weight's
shape), and old models list their initializers as graph inputs. After these passes a
pattern sees plain constant initializers and inferred shapes.

Constant folding is onnxscript's (with size limits, so a pre-pass never materialises a
huge tensor); identity and unused-node elimination and lifting Constant nodes are
onnx-ir's passes. Our own code is only what those do not do: the cleanups of
``_cleanups.py`` (IR<4 initializer-inputs as constants, inference-mode Dropout, an
Identity elimination that keeps every graph's outputs) and a linear whole-graph shape
inference (``_shape_inference.py``: onnx's, with data propagation, so symbolic dims such
as the batch and sequence of a TorchScript export flow through Shape/Concat/Reshape).
This module holds the options and the order the passes run in.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Protocol

import onnx_ir as ir
import onnx_ir.passes.common as common
from onnxscript.optimizer import fold_constants

from autofusion.fusion_core.prepasses._cleanups import (
    DropoutEliminationPass,
    IdentityEliminationPass,
    InitializerInputsToConstantsPass,
)
from autofusion.fusion_core.prepasses._shape_inference import SymbolicShapeInferencePass
from autofusion.fusion_core.prepasses.broadcasts import BroadcastingExpandPass
from autofusion.fusion_core.prepasses.shape_reads import ShapeReadsFromInputsPass

__all__ = ["PassGuard", "PrepassOptions", "run_prepasses"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class PrepassOptions:
    fold_constants: bool = True
    # Elements, not bytes. The output limit fits the largest conv/linear weights of
    # common CNNs (ResNet-50's fc is 2M) without materialising giant embedding tables.
    fold_input_size_limit: int = 1 << 22
    fold_output_size_limit: int = 1 << 23
    shape_inference: bool = True
    # Initializers above this many elements reach onnx's shape inference as typed graph
    # inputs without data (keeps the proto small and models over 2 GB inferable); the
    # small ones stay, since Reshape and data propagation read their values.
    shape_inference_initializer_limit: int = 1024


def _fold_constant_of_shape(node: ir.Node) -> bool | None:
    # onnxscript keeps ConstantOfShape to keep files small, but weights written as
    # ConstantOfShape (as in the ONNX model zoo's light models) must become constants
    # for BatchNorm folding. The output size limit still bounds what is materialised.
    if node.op_type == "ConstantOfShape" and node.domain in ("", "ai.onnx"):
        return True
    return None


class PassGuard(Protocol):
    """What watches the passes (``fusion_core.pipeline.transaction.StepGuard``): told of
    each pass that changed the model, and of each that raised (it returns what to raise)."""

    def changed(self, name: str) -> None: ...

    def raised(self, name: str, exc: Exception) -> Exception: ...


def run_prepasses(
    model: ir.Model,
    options: PrepassOptions,
    *,
    disabled: Collection[str] = (),
    guard: PassGuard | None = None,
) -> list[str]:
    """Run the pre-passes in place; return the names of those that changed the model.
    ``disabled`` passes do not run; ``guard`` checks each pass's changes as they are made."""
    changed = []

    def run(name: str, pass_: Callable[[ir.Model], bool]) -> None:
        if name in disabled:
            return
        try:
            modified = pass_(model)
        except Exception as exc:
            if guard is None:
                raise
            raise guard.raised(name, exc) from exc
        if modified:
            changed.append(name)
            if guard is not None:
                guard.changed(name)

    def ir_pass(pass_: ir.passes.PassBase) -> Callable[[ir.Model], bool]:
        return lambda m: pass_(m).modified

    def fold(m: ir.Model) -> bool:
        try:
            result = fold_constants(
                m,
                onnx_shape_inference=options.shape_inference,
                input_size_limit=options.fold_input_size_limit,
                output_size_limit=options.fold_output_size_limit,
                should_fold=_fold_constant_of_shape,
            )
        except Exception as exc:  # onnxscript's folder on an op it mishandles: go on
            # What it folded before failing is folded correctly; the check still runs.
            logger.warning("constant folding stopped: %s: %s", type(exc).__name__, exc)
            changed.append(f"constant_folding: stopped early ({type(exc).__name__})")
            if guard is not None:  # what it folded before it stopped is checked all the same
                guard.changed("constant_folding")
            return False
        return result.modified

    run("initializer_inputs", ir_pass(InitializerInputsToConstantsPass()))
    run("dropout_elimination", ir_pass(DropoutEliminationPass()))
    run("identity_elimination", ir_pass(IdentityEliminationPass()))
    if options.fold_constants:
        run("constant_folding", fold)
        lift = common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)
        run("lift_constants", ir_pass(lift))
        run("identity_elimination", ir_pass(IdentityEliminationPass()))
    run("remove_unused", ir_pass(common.RemoveUnusedNodesPass()))
    run("topological_sort", ir_pass(common.TopologicalSortPass()))
    # Constant folding infers each node's shape on its own, which loses symbolic dims
    # computed at run time (Shape -> Concat -> Reshape); a whole-graph inference with
    # data propagation keeps them. Not onnx-ir's ShapeInferencePass: it is quadratic in
    # the number of initializers in onnx-ir 1.1 (docs/benchmarks.md).
    if options.shape_inference:
        limit = options.shape_inference_initializer_limit
        run("shape_inference", ir_pass(SymbolicShapeInferencePass(initializer_limit=limit)))
        run("shape_reads_from_inputs", ir_pass(ShapeReadsFromInputsPass()))
        run("broadcasting_expand", ir_pass(BroadcastingExpandPass()))
        run("remove_unused", ir_pass(common.RemoveUnusedNodesPass()))
    return changed
