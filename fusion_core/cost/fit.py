"""Kernel factors learned from profiled reports: where the roofline misprices a fused op.

A profiled report (``optimize --profile``) holds, per fused region, the cost model's
prediction (``predicted_gain``: roofline µs of the replaced nodes and of the fused
kernel) and onnxruntime's measurement (``measured_gain``: traced µs of the same).

- A region's factor is its measured ratio over its predicted one,
  ``(measured after / measured before) / (predicted after / predicted before)``: how
  much slower (> 1) or faster the fused kernel runs, relative to the nodes it replaced,
  than the roofline says. Multiplying the fused kernel's predicted time by it makes the
  predicted ratio the measured one; being a ratio of ratios, it does not depend on how
  far the roofline is off for the whole machine.
- Where later fusions built on earlier ones (Conv+BN folded, then the Relu joined), the
  region's kernel is the last fusion's and its rewriter gets the factor; the region's
  predicted before is the chain's: the sum of every fusion's before less the afters
  that a later fusion consumed.
- Regions are learned per ``kernel_factors`` key: the key that priced the region's
  kernel (``predicted_gain.kernel_factor_key``: ``attention+softcap+cache``), else the
  region's rewriter. The region's factor is multiplied by the one its prediction was
  made with (``predicted_gain.kernel_factor``, 1 when absent), so it is the key's own
  factor, not a correction of the profile's: put a key into the profile the reports are
  made with (any factor that keeps the fusion in) to learn it apart.
- A key's factor is the median over its regions; ``FittedFactor`` keeps the count
  and the range so a caller can see how much the regions agree. The machine scale
  (median measured / predicted before, over all regions) is returned as a diagnostic.

The factor multiplies the fused kernel's predicted time (``TargetProfile.kernel_factors``),
so a fusion whose kernel measured slower than the nodes it replaced is predicted to lose,
and cost-based selection leaves it out.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from autofusion.fusion_core.errors import ConfigError

__all__ = ["FittedFactor", "fit_kernel_factors"]


@dataclass(frozen=True)
class FittedFactor:
    key: str  # the kernel_factors key it learns: a rewriter, or a more specific key
    factor: float  # median over the regions
    regions: int
    low: float
    high: float


def fit_kernel_factors(reports: Iterable[Mapping[str, Any]]) -> tuple[float, list[FittedFactor]]:
    """The machine scale and one factor per key (the one that priced a region, else its
    rewriter) seen in profiled ``reports``.

    Raises ConfigError when no report holds a region with both a prediction and a
    measurement (a report made without ``--profile``, or before predictions existed).
    """
    regions = [r for report in reports for r in _regions(report.get("applied") or [])]
    if not regions:
        raise ConfigError(
            "no fused region in these reports has both a predicted and a measured gain",
            hint="write the reports with `autofusion optimize --profile --report FILE`",
        )
    scale = statistics.median(r.measured_before / r.predicted_before for r in regions)
    by_key: dict[str, list[float]] = defaultdict(list)
    for r in regions:
        measured = r.measured_after / r.measured_before
        predicted = r.predicted_after / r.predicted_before
        by_key[r.key].append(measured / predicted * r.priced_with)
    fitted = [
        FittedFactor(name, statistics.median(values), len(values), min(values), max(values))
        for name, values in sorted(by_key.items())
    ]
    return scale, fitted


@dataclass(frozen=True)
class _Region:
    key: str  # the kernel_factors key that priced it, else its rewriter
    predicted_before: float  # of the whole chain of fusions that made the region
    predicted_after: float
    measured_before: float
    measured_after: float
    priced_with: float  # the kernel factor of the prediction


def _regions(applied: Sequence[Mapping[str, Any]]) -> list[_Region]:
    found = []
    for index, entry in enumerate(applied):
        measured = entry.get("measured_gain") or {}
        chain = _chain(applied, index)
        if chain is None or not entry.get("rewriter"):
            continue
        before = sum(_predicted(applied[i], "before_us") for i in chain)
        before -= sum(_predicted(applied[i], "after_us") for i in chain[:-1])
        numbers = (
            before,
            _predicted(entry, "after_us"),
            measured.get("before_us"),
            measured.get("after_us"),
        )
        if all(isinstance(n, (int, float)) and n > 0 for n in numbers):
            found.append(_Region(_key(entry), *numbers, _priced_with(entry)))
    return found


def _key(entry: Mapping[str, Any]) -> str:
    key = (entry.get("predicted_gain") or {}).get("kernel_factor_key")
    return key if isinstance(key, str) and key else entry["rewriter"]


def _priced_with(entry: Mapping[str, Any]) -> float:
    factor = (entry.get("predicted_gain") or {}).get("kernel_factor")
    valid = isinstance(factor, (int, float)) and not isinstance(factor, bool) and factor > 0
    return float(factor) if valid else 1.0


def _predicted(entry: Mapping[str, Any], key: str) -> float:
    value = (entry.get("predicted_gain") or {}).get(key)
    return float(value) if isinstance(value, (int, float)) else float("nan")


def _chain(applied: Sequence[Mapping[str, Any]], index: int) -> list[int] | None:
    """``index`` after every earlier fusion it built on (None if a link is missing)."""
    chain: list[int] = []
    for earlier in (applied[index].get("provenance") or {}).get("from_fusions") or []:
        if not 0 <= earlier < index:
            return None
        part = _chain(applied, earlier)
        if part is None:
            return None
        chain += part
    return chain + [index]
