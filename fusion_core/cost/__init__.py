"""The cost model: per-op costs over inferred shapes, target profiles, kernel factors.

``model.py`` prices a candidate (``CostModel``); ``_ops.py`` the per-op FLOPs and bytes;
``_profiles.py`` loads the target profiles (``fusion_core/target_profiles/*.yaml``);
``fit.py`` fits kernel factors from profiled reports (``autofusion calibrate``). What a
rewrite does to the cost of its nodes each rewriter says itself (``Rewriter.cost_effect``).
"""

from autofusion.fusion_core.cost.fit import FittedFactor, fit_kernel_factors
from autofusion.fusion_core.cost.model import (
    PROFILE_NAME_PATTERN,
    Calibration,
    CostModel,
    Gain,
    NodeCost,
    RewriteEffect,
    TargetProfile,
    dump_target_profile,
    load_target_profile,
    rewrite_effect,
    shipped_profiles,
)

__all__ = [
    "PROFILE_NAME_PATTERN",
    "Calibration",
    "CostModel",
    "FittedFactor",
    "Gain",
    "NodeCost",
    "RewriteEffect",
    "TargetProfile",
    "dump_target_profile",
    "fit_kernel_factors",
    "load_target_profile",
    "rewrite_effect",
    "shipped_profiles",
]
