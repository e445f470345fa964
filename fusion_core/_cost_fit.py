"""Kernel factors learned from profiled reports: where the roofline misprices a fused op.

A profiled report (``optimize --profile``) holds, per fused region, the cost model's
prediction (``predicted_gain``: roofline µs of the replaced nodes and of the fused
kernel) and onnxruntime's measurement (``measured_gain``: traced µs of the same). The
roofline is off by a machine-wide scale (the runtime reaches some fraction of the
bandwidth it prices) and, for some fused kernels, by more: that excess is the factor.

- The scale ``s`` is the median, over regions made by a single fusion, of measured
  before / predicted before: how the unfused nodes really run against the roofline.
- A region's factor is measured after / (predicted after * s): its fused kernel against
  what the roofline, scaled like the unfused nodes, says. Where later fusions built on
  earlier ones (Conv+BN folded, then the Relu joined), the region's kernel is the last
  fusion's, so the last fusion's rewriter and predicted after are used.
- A rewriter's factor is the median over its regions; ``FittedFactor`` keeps the count
  and the range so a caller can see how much the regions agree.

The factor multiplies the fused kernel's predicted time (``TargetProfile.kernel_factors``),
so a factor of 4 makes a fusion whose kernel runs 4x slower than its roofline predict a
loss, and cost-based selection leaves it out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fusion_core.errors import ConfigError

__all__ = ["FittedFactor", "fit_kernel_factors"]


@dataclass(frozen=True)
class FittedFactor:
    rewriter: str
    factor: float  # median over the regions
    regions: int
    low: float
    high: float


def fit_kernel_factors(reports: Iterable[Mapping[str, Any]]) -> tuple[float, list[FittedFactor]]:
    """The machine scale and one factor per rewriter seen in profiled ``reports``.

    Raises ConfigError when no report holds a region with both a prediction and a
    measurement (a report made without ``--profile``, or before predictions existed).
    """
    regions = [r for report in reports for r in _regions(report.get("applied") or [])]
    singles = [r.measured_before / r.predicted_before for r in regions if r.single]
    if not singles:
        raise ConfigError(
            "no fused region in these reports has both a predicted and a measured gain",
            hint="write the reports with `autofusion optimize --profile --report FILE`",
        )
    scale = statistics.median(singles)
    by_rewriter: dict[str, list[float]] = defaultdict(list)
    for r in regions:
        by_rewriter[r.rewriter].append(r.measured_after / (r.predicted_after * scale))
    fitted = [
        FittedFactor(name, statistics.median(values), len(values), min(values), max(values))
        for name, values in sorted(by_rewriter.items())
    ]
    return scale, fitted


@dataclass(frozen=True)
class _Region:
    rewriter: str
    single: bool  # made by one fusion (no earlier fusion's nodes inside)
    predicted_before: float
    predicted_after: float
    measured_before: float
    measured_after: float


def _regions(applied: Sequence[Mapping[str, Any]]) -> list[_Region]:
    found = []
    for entry in applied:
        predicted = entry.get("predicted_gain") or {}
        measured = entry.get("measured_gain") or {}
        numbers = (
            predicted.get("before_us"),
            predicted.get("after_us"),
            measured.get("before_us"),
            measured.get("after_us"),
        )
        rewriter = entry.get("rewriter")
        if not rewriter or not all(isinstance(n, (int, float)) and n > 0 for n in numbers):
            continue
        single = not (entry.get("provenance") or {}).get("from_fusions")
        found.append(_Region(rewriter, single, *numbers))
    return found
