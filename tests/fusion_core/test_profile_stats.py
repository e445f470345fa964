"""The paired ratio: its median, its order-statistic interval, and the verdict."""

from __future__ import annotations

import math

import numpy as np
import pytest

from autofusion.fusion_core.profiling.stats import FASTER, MARGIN, NO_CHANGE, SLOWER, paired_ratio


def test_the_interval_of_20_pairs_is_the_6th_and_15th_order_statistic() -> None:
    baseline = [1.0] * 20
    treatment = [0.80 + 0.01 * k for k in range(20)]  # ratios 0.80 ... 0.99, shuffled below
    order = np.random.default_rng(0).permutation(20)
    result = paired_ratio([treatment[i] for i in order], [baseline[i] for i in order])
    assert result is not None
    assert result.runs == 20
    assert result.median == pytest.approx(0.895, rel=0, abs=1e-12)
    assert (result.low, result.high) == (pytest.approx(0.85), pytest.approx(0.94))
    # P(Binomial(20, 1/2) <= 5) = 0.0207: coverage 1 - 2 * 0.0207
    assert result.confidence == pytest.approx(1 - 2 * 21700 / 2**20, rel=1e-12)
    assert result.verdict == FASTER
    assert result.speedup == pytest.approx(1 / 0.895)


def test_pairs_cancel_drift_that_medians_would_see_as_noise() -> None:
    # The machine slows down threefold halfway; the fused model is 5% faster throughout.
    drift = [1.0] * 15 + [3.0] * 15
    original = [d * 10.0 for d in drift]
    fused = [d * 9.5 for d in drift]
    result = paired_ratio(fused, original)
    assert result.verdict == FASTER
    assert result.low == pytest.approx(0.95) and result.high == pytest.approx(0.95)


@pytest.mark.parametrize(
    ("ratios", "verdict"),
    [
        ([0.97, 0.98, 0.99, 1.01, 1.02, 1.03] * 4, NO_CHANGE),
        ([1.04, 1.05, 1.06, 1.07, 1.08, 1.09] * 4, SLOWER),
        ([0.9, 0.91, 0.92, 0.93, 0.94, 0.95] * 4, FASTER),
    ],
)
def test_the_verdict_reads_the_interval(ratios, verdict) -> None:
    result = paired_ratio(ratios, [1.0] * len(ratios))
    assert result.verdict == verdict
    assert result.low <= result.median <= result.high


@pytest.mark.parametrize("centre", [0.995, 1.005])
def test_a_tight_interval_within_the_margin_is_no_measurable_change(centre) -> None:
    # an A/A run's kind of result: every pair within 0.1% of centre, so the interval
    # excludes 1, but the change is smaller than MARGIN
    ratios = [centre * (1 + 0.0002 * (k - 10)) for k in range(21)]
    result = paired_ratio(ratios, [1.0] * len(ratios))
    assert result.high < 1.0 or result.low > 1.0
    assert abs(result.median - 1.0) < MARGIN
    assert result.verdict == NO_CHANGE


@pytest.mark.parametrize(("centre", "verdict"), [(0.985, FASTER), (1.015, SLOWER)])
def test_a_tight_interval_beyond_the_margin_has_a_verdict(centre, verdict) -> None:
    ratios = [centre * (1 + 0.0002 * (k - 10)) for k in range(21)]
    assert paired_ratio(ratios, [1.0] * len(ratios)).verdict == verdict


def test_few_pairs_give_the_whole_range_and_say_their_lower_coverage() -> None:
    result = paired_ratio([0.5, 0.6, 0.7], [1.0, 1.0, 1.0])
    assert (result.low, result.high) == (0.5, 0.7)
    assert result.confidence == pytest.approx(0.75)
    assert paired_ratio([], []) is None
    assert paired_ratio([1.0], [0.0]) is None  # a zero baseline is no pair


def test_coverage_is_at_least_the_asked_confidence_for_every_size() -> None:
    for n in range(6, 200):
        result = paired_ratio(list(range(1, n + 1)), [1.0] * n)
        assert 0.95 <= result.confidence < 1.0, n
        assert math.isfinite(result.low) and result.low < result.high
