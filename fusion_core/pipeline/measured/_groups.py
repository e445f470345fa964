"""The groups of fusions measured selection times as one, and the decision on each.

The fusions of one pattern that emit the same ops form a group: a BERT's 12 attention
blocks are one measurement, not 12. A decision keeps or leaves out a whole group, with
the paired ratio it was decided on (measured now, or combined from the verdict store),
or why it was not measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from autofusion.fusion_core.pipeline.result import AppliedFusion
from autofusion.fusion_core.profiling.stats import PairedRatio
from autofusion.fusion_core.profiling.verdicts import CombinedVerdict

__all__ = [
    "MEASURED",
    "NOT_MEASURED",
    "STORE",
    "Decision",
    "FusionGroup",
    "SkipMap",
    "group_fusions",
]

# (pattern, matched node names) -> why that fusion is not applied (optimize_once's skip)
SkipMap = dict[tuple[str, frozenset[str]], str]


@dataclass
class FusionGroup:
    """The fusions of one pattern that emit the same ops: measured together."""

    pattern: str
    new_ops: tuple[str, ...]
    fusions: list[AppliedFusion] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.pattern} -> {'+'.join(self.new_ops) or '(nothing)'}"

    @property
    def predicted_saved_us(self) -> float:
        saved = [(f.predicted_gain or {}).get("saved_us") for f in self.fusions]
        return float(sum(s for s in saved if isinstance(s, (int, float))))

    def predicted(self) -> dict[str, Any]:
        """The cost model's prediction summed over the group: a verdict's ``predicted``
        (``before_us``/``after_us`` null unless every fusion has them)."""
        gains = [f.predicted_gain or {} for f in self.fusions]

        def total(name: str) -> float | None:
            values = [g.get(name) for g in gains]
            numbers = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
            return float(sum(values)) if values and numbers else None

        return {
            "saved_us": self.predicted_saved_us,
            "before_us": total("before_us"),
            "after_us": total("after_us"),
            "rewriter": next((f.rewriter for f in self.fusions if f.rewriter), None),
            "fusions": len(self.fusions),
            **_common_pricing(gains),
        }

    def skip(self, reason: str) -> SkipMap:
        return {(f.pattern, frozenset(f.replaced_nodes)): reason for f in self.fusions}


def _common_pricing(gains: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``kernel_factors`` key and factor that priced every fusion of the group, so
    that ``calibrate --from-verdicts`` learns that key apart (``attention+softcap+cache``
    is not ``attention``); nothing when the fusions were priced by different keys, whose
    kernels one measurement cannot tell apart."""
    keys = {g.get("kernel_factor_key") for g in gains}
    factors = {g.get("kernel_factor") for g in gains}
    if len(keys) != 1 or not isinstance(key := keys.pop(), str) or not key:
        return {}
    factor = factors.pop() if len(factors) == 1 else None
    valid = isinstance(factor, int | float) and not isinstance(factor, bool) and factor > 0
    return {"kernel_factor_key": key, **({"kernel_factor": float(factor)} if valid else {})}


def group_fusions(applied: Sequence[AppliedFusion]) -> list[FusionGroup]:
    """Groups by pattern and emitted ops, the largest predicted gain first."""
    groups: dict[tuple[str, tuple[str, ...]], FusionGroup] = {}
    for fusion in applied:
        key = (fusion.pattern, tuple(sorted(set(fusion.new_ops))))
        groups.setdefault(key, FusionGroup(*key)).fusions.append(fusion)
    return sorted(groups.values(), key=lambda g: (-g.predicted_saved_us, g.key))


# Where a decision came from (the report's ``source`` per group)
STORE, MEASURED, NOT_MEASURED = "store", "measured", "not measured"


@dataclass
class Decision:
    """Whether a group is kept, why, and on what evidence: a paired ratio measured in this
    run, or the combined verdict of the store's measurements (``source``), or none."""

    group: FusionGroup
    kept: bool
    reason: str
    ratio: PairedRatio | None = None
    source: str = NOT_MEASURED
    signature: str | None = None
    combined: CombinedVerdict | None = None  # source "store": what it was decided on

    def to_dict(self) -> dict[str, Any]:
        return {
            "group": self.group.key,
            "pattern": self.group.pattern,
            "new_ops": list(self.group.new_ops),
            "fusions": len(self.group.fusions),
            "predicted_saved_us": self.group.predicted_saved_us,
            "kept": self.kept,
            "source": self.source,
            "cached": self.source == STORE,  # the older reports' name for it
            "signature": self.signature,
            "ratio": self.ratio.to_dict() if self.ratio else None,
            "combined": self.combined.to_dict() if self.combined else None,
            "reason": self.reason,
        }
