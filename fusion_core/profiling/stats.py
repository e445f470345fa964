"""How much faster, and how sure: the paired ratio of two models' run times.

Two sessions timed in the same interleaved iteration see the same machine state (the
same neighbour job, the same clock frequency), so the ratio of their two run times in
one iteration is far steadier than the ratio of two separately taken medians. Over the
iterations those ratios give a median and a distribution-free confidence interval for
it: the interval between two order statistics chosen from the binomial distribution
(the classic sign-test interval). It assumes nothing about the shape of the noise,
which on a shared machine is skewed and has outliers.

The verdict reads the interval and the median: ``faster`` when all of the interval is
below 1 and the median at least ``MARGIN`` below it, ``slower`` when all of it is above 1
and the median at least ``MARGIN`` above, ``no measurable change`` otherwise. The margin
is there because pairing cancels the machine's drift but not what differs between two
sessions of one model (where the allocator put the buffers): an A/A run, one model
against a copy of itself, gave a tight interval off 1 by under 1% (once "slower" in 8
runs without the margin).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

__all__ = [
    "CONFIDENCE",
    "FASTER",
    "MARGIN",
    "NO_CHANGE",
    "SLOWER",
    "VERDICTS",
    "PairedRatio",
    "paired_ratio",
    "verdict_of",
]

FASTER, NO_CHANGE, SLOWER = "faster", "no measurable change", "slower"
VERDICTS = (FASTER, NO_CHANGE, SLOWER)
Verdict = Literal["faster", "no measurable change", "slower"]
CONFIDENCE = 0.95
MARGIN = 0.01  # the smallest change of the median a verdict other than "no change" needs
# Below this many pairs no order-statistic interval reaches 95% coverage
# (0.5**5 * 2 = 0.0625 > 0.05): the interval is then the whole range seen.
_MIN_PAIRS_FOR_INTERVAL = 6


@dataclass(frozen=True)
class PairedRatio:
    """``treatment / baseline`` run times, paired per iteration (below 1: faster)."""

    median: float
    low: float
    high: float
    confidence: float  # the interval's actual coverage (order statistics are discrete)
    runs: int
    verdict: Verdict

    @property
    def speedup(self) -> float:
        return 1.0 / self.median if self.median > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def describe(self) -> str:
        """e.g. ``0.812 (95% interval 0.798-0.826, 20 paired runs)``."""
        return (
            f"{self.median:.3f} ({self.confidence:.0%} interval {self.low:.3f}-{self.high:.3f}, "
            f"{self.runs} paired runs)"
        )


def paired_ratio(
    treatment_s: Sequence[float], baseline_s: Sequence[float], *, confidence: float = CONFIDENCE
) -> PairedRatio | None:
    """The median of ``treatment[i] / baseline[i]`` and its confidence interval; None
    with no complete pair (a zero baseline time is not a pair)."""
    ratios = sorted(t / b for t, b in zip(treatment_s, baseline_s, strict=False) if b > 0)
    if not ratios:
        return None
    low, high, coverage = _median_interval(ratios, confidence)
    median = float(statistics.median(ratios))
    return PairedRatio(
        median=median,
        low=low,
        high=high,
        confidence=coverage,
        runs=len(ratios),
        verdict=verdict_of(low, high, median),
    )


def verdict_of(low: float, high: float, median: float) -> Verdict:
    if high < 1.0 and median <= 1.0 - MARGIN:
        return FASTER
    if low > 1.0 and median >= 1.0 + MARGIN:
        return SLOWER
    return NO_CHANGE


def _median_interval(ordered: list[float], confidence: float) -> tuple[float, float, float]:
    """The widest-k interval ``[x_(k), x_(n-k+1)]`` (1-based) whose coverage is at least
    ``confidence``: coverage = 1 - 2 * P(Binomial(n, 1/2) < k)."""
    n = len(ordered)
    if n < _MIN_PAIRS_FOR_INTERVAL:
        return ordered[0], ordered[-1], 1.0 - 2 * 0.5**n
    tail = 0.0  # P(B < k)
    best_k, best_coverage = 1, 1.0 - 2 * 0.5**n
    for k in range(1, n // 2 + 1):
        tail += math.comb(n, k - 1) * 0.5**n
        coverage = 1.0 - 2 * tail
        if coverage < confidence:
            break
        best_k, best_coverage = k, coverage
    return ordered[best_k - 1], ordered[n - best_k], best_coverage
