"""Pre-passes: what runs before the first match (cleanups, folding, shape inference).

``passes.py`` runs them (``run_prepasses``): the cleanups of ``_cleanups.py``, constant
folding within the growth budget of ``_fold_budget.py``, the shape inference of
``_shape_inference.py`` (with ``_inferences.py``);
``opset.py`` the opt-in opset upgrade;
``shape_reads.py`` rewrites Shape reads of graph inputs so symbolic dims survive;
``broadcasts.py`` drops an Expand that only broadcasts what MatMul would itself.
"""

from autofusion.fusion_core.prepasses._cleanups import IdentityEliminationPass
from autofusion.fusion_core.prepasses._fold_budget import (
    FoldBudget,
    FoldRecord,
    Unfolded,
    constant_bytes,
)
from autofusion.fusion_core.prepasses._shape_inference import SymbolicShapeInferencePass
from autofusion.fusion_core.prepasses.opset import OpsetUpgrade, upgrade_opset
from autofusion.fusion_core.prepasses.passes import PrepassOptions, run_prepasses
from autofusion.fusion_core.prepasses.shape_reads import ShapeReadsFromInputsPass

__all__ = [
    "FoldBudget",
    "FoldRecord",
    "IdentityEliminationPass",
    "OpsetUpgrade",
    "PrepassOptions",
    "ShapeReadsFromInputsPass",
    "SymbolicShapeInferencePass",
    "Unfolded",
    "constant_bytes",
    "run_prepasses",
    "upgrade_opset",
]
