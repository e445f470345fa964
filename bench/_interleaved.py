"""Interleaved timing: the shared loop of the benchmarks that compare model variants.

Each iteration runs every variant once, in an order that rotates, so that drift in the
machine's speed falls on all variants alike; the summary is per variant the median and
the median of the ratios paired by iteration against a base variant, with p10-p90.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import numpy as np

__all__ = ["interleaved_ms", "paired_summary"]


def interleaved_ms(
    runs: dict[str, Callable[[], object]], *, warmup: int, iters: int
) -> dict[str, list[float]]:
    """Milliseconds per run of every variant, ``iters`` interleaved rounds after warm-up."""
    labels = list(runs)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for i in range(warmup + iters if labels else 0):
        k = i % len(labels)
        for label in labels[k:] + labels[:k]:
            start = time.perf_counter()
            runs[label]()
            if i >= warmup:
                times[label].append((time.perf_counter() - start) * 1000)
    return times


def paired_summary(times: dict[str, list[float]], base: str) -> dict[str, dict[str, float]]:
    """Per variant: median ms, and the median paired ratio to ``base`` with p10/p90."""
    out = {}
    for label, samples in times.items():
        paired = [t / b for t, b in zip(samples, times[base], strict=True)]
        out[label] = {
            "median_ms": statistics.median(samples),
            "paired_ratio": statistics.median(paired),
            "p10": float(np.percentile(paired, 10)),
            "p90": float(np.percentile(paired, 90)),
        }
    return out
