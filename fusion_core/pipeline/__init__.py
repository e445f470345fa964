"""The pipeline: pre-passes, rounds of match, select and rewrite, then the check.

``optimize`` (``modes.py``) runs one pass (``once.py``), progressive validation's checked
stages (``progressive.py``) or measured selection (``measured/``), as the config's mode
says. The one pass runs the rounds as a pass that returns what it did (``rounds.py``)
and the check against the original (``check.py``) into a ``Result`` (``result.py``);
``switches.py`` turns patterns on or off by input shapes and ``left_alone.py`` names what
the engine leaves as it is (quantized units, unknown domains). Every step is a
transaction (``transaction.py``: a step that breaks the graph is taken back, with a
reproducer of its region, ``reproducer.py``) and a failed check falls back to the
largest set of fusions that passes (``fallback.py``). ``memory.py`` measures the run's own
peak memory by phase and predicts it before a run.
"""

from autofusion.fusion_core.pipeline.check import check_against_original
from autofusion.fusion_core.pipeline.measured import FusionGroup, group_fusions, optimize_measured
from autofusion.fusion_core.pipeline.memory import (
    MemoryPrediction,
    PhaseMemory,
    predict_memory,
    predict_peak_bytes,
)
from autofusion.fusion_core.pipeline.modes import optimize
from autofusion.fusion_core.pipeline.once import optimize_once, select_patterns
from autofusion.fusion_core.pipeline.progressive import (
    DEFAULT_STAGES,
    Rollback,
    optimize_progressive,
)
from autofusion.fusion_core.pipeline.reproducer import reproducer_names, reproducers_zip
from autofusion.fusion_core.pipeline.result import (
    PROFILE_UNFINISHED,
    AppliedFusion,
    Rejection,
    Result,
)
from autofusion.fusion_core.pipeline.rounds import RewriteRounds, RoundsResult, subgraphs
from autofusion.fusion_core.profiling import PairedTimer  # measured selection's, as before

__all__ = [
    "DEFAULT_STAGES",
    "PROFILE_UNFINISHED",
    "AppliedFusion",
    "FusionGroup",
    "MemoryPrediction",
    "PairedTimer",
    "PhaseMemory",
    "Rejection",
    "Result",
    "RewriteRounds",
    "Rollback",
    "RoundsResult",
    "check_against_original",
    "group_fusions",
    "optimize",
    "optimize_measured",
    "optimize_once",
    "optimize_progressive",
    "predict_memory",
    "predict_peak_bytes",
    "reproducer_names",
    "reproducers_zip",
    "select_patterns",
    "subgraphs",
]
