"""Measured selection: the cost model proposes, the target machine decides.

``_optimize.py`` runs it (``optimize_measured``: propose, decide each group, keep what
measured faster, compare with the original once more); ``_groups.py`` holds the groups
of fusions measured as one and the decision on each; ``_decide.py`` decides a group
from the verdict store or by timing it with the paired timer
(``fusion_core.profiling.PairedTimer``); ``_variants.py`` builds the models compared;
``_signature.py`` names a group's regions without names or weights (what a verdict is
about); ``fusion_core.profiling.verdicts`` is a verdict, its file format and how
measurements combine (light: the service reads verdicts without loading the pipeline);
``_store.py`` reads the verdicts a run may reuse and keeps the local CLI's.
docs/measured.md says what it does for a user.
"""

from autofusion.fusion_core.pipeline.measured._groups import FusionGroup, group_fusions
from autofusion.fusion_core.pipeline.measured._optimize import optimize_measured
from autofusion.fusion_core.pipeline.measured._signature import (
    RegionSignature,
    group_signature,
    pattern_hash,
    shape_class,
)
from autofusion.fusion_core.pipeline.measured._store import STORE_FILE, VerdictStore

__all__ = [
    "STORE_FILE",
    "FusionGroup",
    "RegionSignature",
    "VerdictStore",
    "group_fusions",
    "group_signature",
    "optimize_measured",
    "pattern_hash",
    "shape_class",
]
