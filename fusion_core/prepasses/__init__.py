"""Pre-passes: what runs before the first match (cleanups, folding, shape inference).

``passes.py`` runs them (``run_prepasses``); ``opset.py`` the opt-in opset upgrade;
``shape_reads.py`` rewrites Shape reads of graph inputs so symbolic dims survive;
``broadcasts.py`` drops an Expand that only broadcasts what MatMul would itself.
"""

from autofusion.fusion_core.prepasses.opset import OpsetUpgrade, upgrade_opset
from autofusion.fusion_core.prepasses.passes import (
    IdentityEliminationPass,
    PrepassOptions,
    SymbolicShapeInferencePass,
    run_prepasses,
)
from autofusion.fusion_core.prepasses.shape_reads import ShapeReadsFromInputsPass

__all__ = [
    "IdentityEliminationPass",
    "OpsetUpgrade",
    "PrepassOptions",
    "ShapeReadsFromInputsPass",
    "SymbolicShapeInferencePass",
    "run_prepasses",
    "upgrade_opset",
]
