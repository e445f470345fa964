"""Measured selection: the cost model proposes, the target machine decides.

``_optimize.py`` runs it (``optimize_measured``: propose, measure each group, keep what
measured faster, compare with the original once more); ``_groups.py`` holds the groups
of fusions measured as one and the decision on each; ``_decide.py`` decides a group
from the cache or by timing it with the paired timer (``fusion_core.profiling.PairedTimer``);
``_variants.py`` builds the models compared; ``_measure_cache.py`` keeps the decisions
per machine class and model structure. docs/measured.md says what it does for a user.
"""

from autofusion.fusion_core.pipeline.measured._groups import FusionGroup, group_fusions
from autofusion.fusion_core.pipeline.measured._optimize import optimize_measured

__all__ = ["FusionGroup", "group_fusions", "optimize_measured"]
