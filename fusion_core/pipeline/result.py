"""What one optimization did: ``Result``, and each fusion it applied (``AppliedFusion``).

Every mode returns a ``Result`` (one pass, progressive stages, measured selection); the
report (fusion_core/report) is built from it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import onnx
import onnx_ir as ir

from autofusion.fusion_core.patterns import NearMiss
from autofusion.fusion_core.prepasses import FoldRecord
from autofusion.fusion_core.validate import CheckResult, PrecisionReport, RegionReport

if TYPE_CHECKING:  # the measured package imports this module
    from autofusion.fusion_core.profiling.verdicts import VerdictRecord

__all__ = ["PROFILE_UNFINISHED", "AppliedFusion", "Rejection", "Result"]

# The report's profile while profiling runs (``files.run`` writes that report first): what
# a run stopped while profiling (a worker's time limit) leaves behind with its model.
PROFILE_UNFINISHED = "profiling did not finish: the run was stopped while profiling"


@dataclass(frozen=True)
class AppliedFusion:
    pattern: str
    replaced_nodes: tuple[str, ...]
    new_nodes: tuple[str, ...]
    new_ops: tuple[str, ...]
    round: int
    rewriter: str | None = None  # its name in the rewriter registry
    # The cost model's prediction for this fusion on config.target_profile
    # (fusion_core.cost.Gain.prediction), priced on the graph it was applied to.
    predicted_gain: dict | None = None
    # What the rewriter left unfused here (Rewrite.notes), reported as near misses
    notes: tuple[str, ...] = ()

    def near_misses(self) -> list[NearMiss]:
        """The notes as near misses of kind ``rewriter`` at the fused place."""
        return [NearMiss(self.pattern, self.replaced_nodes, n, "rewriter") for n in self.notes]

    def to_dict(self) -> dict:
        return {
            "pattern": self.pattern,
            "replaced_nodes": list(self.replaced_nodes),
            "new_nodes": list(self.new_nodes),
            "new_ops": list(self.new_ops),
            "round": self.round,
            "rewriter": self.rewriter,
            "predicted_gain": self.predicted_gain,
        }


@dataclass(frozen=True)
class Rejection:
    """A step that broke the graph or raised, rolled back (or skipped) while the run went
    on (``fusion_core.pipeline.transaction``): always a bug of ours, never the model's."""

    # "rewrite", "canonical" (a canonical-form rule), "pre-pass", "match" (one pattern's
    # search: that pattern is left out) or "rounds" (selection and the rounds themselves:
    # no fusion at all then)
    step: str
    name: str  # the pattern, the rule or the pre-pass
    nodes: tuple[str, ...]  # the matched nodes (a rewrite) or the nodes the step wrote
    failed: str  # what failed, in words
    kind: str = "bug"
    # The matched region cut out as a model of its own (pipeline/reproducer.py), for a
    # bug report: written beside the report, not inside it
    reproducer: onnx.ModelProto | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict:
        return {
            "step": self.step,
            "name": self.name,
            "nodes": list(self.nodes),
            "failed": self.failed,
            "kind": self.kind,
        }


@dataclass
class Result:
    """What one optimization did. ``model`` is the fused model (onnx-ir)."""

    model: ir.Model
    target: str
    patterns_used: list[str]
    applied: list[AppliedFusion] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    # Op types of the main graph; the If/Loop/Scan bodies' are counted apart.
    ops_before: Counter = field(default_factory=Counter)
    ops_after: Counter = field(default_factory=Counter)
    subgraph_ops_before: Counter = field(default_factory=Counter)
    subgraph_ops_after: Counter = field(default_factory=Counter)
    timings: dict[str, float] = field(default_factory=dict)
    rounds: int = 0
    prepasses: list[str] = field(default_factory=list)
    check: CheckResult | None = None
    regions: RegionReport | None = None  # set when the check fails: which fusion drifts
    rollbacks: list[dict] = field(default_factory=list)  # progressive validation took back
    structure: list[str] = field(default_factory=list)  # what a rewrite broke (empty: nothing)
    rejected: list[Rejection] = field(default_factory=list)  # steps rolled back as bugs
    # A failed check fell back (fallback.py): why, fusions kept, which were dropped
    fallback: dict | None = None
    precision: PrecisionReport | None = None  # fp16 range analysis, when asked for
    selections: list[dict] = field(default_factory=list)  # cost-based selection, per round
    switches: list[dict] = field(default_factory=list)  # dynamic switches and whether they fired
    left_alone: list[dict] = field(default_factory=list)  # parts no rule rewrites, and why
    measurement: dict | None = None  # measured selection: groups, decisions, final ratio
    # Measured selection's verdicts measured in this run (pipeline.measured.VerdictRecord),
    # what run() writes to RunFiles.verdicts; empty in the other modes
    verdicts: list[VerdictRecord] = field(default_factory=list)
    # Constant folding's growth budget and what it left unfolded; None: no folding ran
    folding: FoldRecord | None = None
    # Bytes of constants in the model as given (prepasses.constant_bytes): what the
    # fused model's size is capped against (size_cap.py); None: not measured
    input_bytes: int | None = None
    # The types and shapes the written form left out of ``model``, by value name
    # (written.py): what reads inferred shapes after the pass reads them here
    inferred: dict[str, tuple[ir.TypeProtocol | None, ir.Shape | None]] = field(
        default_factory=dict
    )

    @property
    def counts(self) -> dict[str, int]:
        return dict(Counter(f.pattern for f in self.applied))

    def to_proto(self) -> onnx.ModelProto:
        return ir.to_proto(self.model)
