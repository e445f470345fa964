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

from autofusion.fusion_core.config import FOLD_GROWTH_FLOOR_BYTES, FOLD_GROWTH_RATIO
from autofusion.fusion_core.prepasses._cleanups import (
    DropoutEliminationPass,
    IdentityEliminationPass,
    InitializerInputsToConstantsPass,
)
from autofusion.fusion_core.prepasses._fold_budget import FoldBudget, FoldRecord
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
    # Bytes, net, of constants the whole fold may add: ratio x the model's constant
    # bytes + floor (``_fold_budget.py``; OptimizeConfig documents the defaults).
    fold_growth_ratio: float = FOLD_GROWTH_RATIO
    fold_growth_floor_bytes: int = FOLD_GROWTH_FLOOR_BYTES
    shape_inference: bool = True
    # Initializers above this many elements reach onnx's shape inference as typed graph
    # inputs without data (keeps the proto small and models over 2 GB inferable); the
    # small ones stay, since Reshape and data propagation read their values.
    shape_inference_initializer_limit: int = 1024


def _fold_constant_of_shape(node: ir.Node) -> bool | None:
    # onnxscript keeps ConstantOfShape to keep files small, but weights written as
    # ConstantOfShape (as in the ONNX model zoo's light models) must become constants
    # for BatchNorm folding. The output size limit and the growth budget still bound
    # what is materialised (``_fold_budget.py``).
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
    folding: list[FoldRecord] | None = None,
) -> list[str]:
    """Run the pre-passes in place; return the names of those that changed the model.
    ``disabled`` passes do not run; ``guard`` checks each pass's changes as they are made;
    ``folding`` receives what constant folding was allowed and what it left unfolded."""
    run = _Runner(model, disabled, guard)
    run("initializer_inputs", _ir(InitializerInputsToConstantsPass()))
    run("dropout_elimination", _ir(DropoutEliminationPass()))
    run("identity_elimination", _ir(IdentityEliminationPass()))
    if options.fold_constants:
        # one step with the lifting: onnxscript writes its results as Constant nodes in
        # the latest spelling (value_ints: opset 12), which become initializers next
        run(
            "constant_folding",
            lambda m: _fold(m, options, run, folding),
            check_after="lift_constants",
        )
        lift = common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0)
        run("lift_constants", _ir(lift))
        run("identity_elimination", _ir(IdentityEliminationPass()))
    run("remove_unused", _ir(common.RemoveUnusedNodesPass()))
    run("topological_sort", _ir(common.TopologicalSortPass()))
    # Constant folding infers each node's shape on its own, which loses symbolic dims
    # computed at run time (Shape -> Concat -> Reshape); a whole-graph inference with
    # data propagation keeps them. Not onnx-ir's ShapeInferencePass: it is quadratic in
    # the number of initializers in onnx-ir 1.1 (docs/benchmarks.md).
    if options.shape_inference:
        limit = options.shape_inference_initializer_limit
        run("shape_inference", _ir(SymbolicShapeInferencePass(initializer_limit=limit)))
        run("shape_reads_from_inputs", _ir(ShapeReadsFromInputsPass()))
        run("broadcasting_expand", _ir(BroadcastingExpandPass()))
        run("remove_unused", _ir(common.RemoveUnusedNodesPass()))
    return run.changed


class _Runner:
    """Runs one named pass as a step: skipped when disabled, its changes checked (after
    the pass ``check_after`` names, when the two are one step)."""

    def __init__(self, model: ir.Model, disabled: Collection[str], guard: PassGuard | None) -> None:
        self.model, self.disabled, self.guard = model, disabled, guard
        self.changed: list[str] = []
        self.pending: str | None = None  # a changed pass whose check waits for the next

    def __call__(
        self, name: str, pass_: Callable[[ir.Model], bool], *, check_after: str | None = None
    ) -> None:
        if name in self.disabled:
            return
        step = self.pending or name  # what a failure names: the pass that wrote it
        try:
            modified = pass_(self.model)
        except Exception as exc:
            if self.guard is None:
                raise
            raise self.guard.raised(name, exc) from exc
        if modified and not any(c.startswith(f"{name}:") for c in self.changed):
            self.changed.append(name)  # (a pass that stopped early said so itself)
        if check_after is not None and modified:
            self.pending = name
            return
        if (modified or self.pending) and self.guard is not None:
            self.guard.changed(step)
        self.pending = None


def _ir(pass_: ir.passes.PassBase) -> Callable[[ir.Model], bool]:
    return lambda model: pass_(model).modified


def _fold(
    model: ir.Model, options: PrepassOptions, run: _Runner, folding: list[FoldRecord] | None
) -> bool:
    """onnxscript's constant folding with the size limits and the growth budget;
    whether it changed anything."""
    budget = FoldBudget(
        ratio=options.fold_growth_ratio,
        floor=options.fold_growth_floor_bytes,
        input_size_limit=options.fold_input_size_limit,
        output_size_limit=options.fold_output_size_limit,
        decide=_fold_constant_of_shape,
    )
    budget.begin(model)
    try:
        result = fold_constants(
            model,
            onnx_shape_inference=options.shape_inference,
            input_size_limit=options.fold_input_size_limit,
            output_size_limit=options.fold_output_size_limit,
            should_fold=budget,
        )
    except Exception as exc:  # onnxscript's folder on an op it mishandles: go on
        # What it folded before failing is folded correctly; the check still runs.
        logger.warning("constant folding stopped: %s: %s", type(exc).__name__, exc)
        run.changed.append(f"constant_folding: stopped early ({type(exc).__name__})")
        modified = True  # what it folded before it stopped is checked all the same
    else:
        modified = result.modified
    if folding is not None:
        folding.append(budget.record())
    return modified
