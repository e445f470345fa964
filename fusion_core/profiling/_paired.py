"""The paired timer of measured selection: models timed side by side, within a budget.

Two models timed one after the other see different machines: a frequency step, a
neighbour's burst, a cache warmed by the first. ``PairedTimer`` holds a session per
model at the deployment level and thread count (``MeasureOptions``) and runs them
interleaved, one run of each per iteration (``latency.interleaved_ms``), so that each
iteration's ratio compares like with like; ``stats.paired_ratio`` turns the iterations
into a median, an interval and a verdict. The number of runs is planned from the
slowest warm-up so the loop fits the seconds it is given; at least ``min_runs`` run
whatever the budget. Measured selection (fusion_core/pipeline/measured/) decides with
it; tests replace it with a timer whose ratios they choose.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import onnx

from autofusion.fusion_core.config import MeasureOptions, OptimizeConfig
from autofusion.fusion_core.profiling._trace import inputs_for, make_session, prepare_model
from autofusion.fusion_core.profiling.latency import interleaved_ms
from autofusion.fusion_core.profiling.stats import PairedRatio, paired_ratio
from autofusion.fusion_core.validate import (
    CANDIDATES,
    FloatDistribution,
    candidate_dims,
    input_dims,
    random_inputs,
)

__all__ = ["PairedTimer"]

logger = logging.getLogger(__name__)

_WARMUP = 2
_MAX_RUNS = 400


class PairedTimer:
    """Sessions at the deployment level and the paired timing loops, within a budget."""

    providers = ("CPUExecutionProvider",)  # what the decisions it informs are cached by

    def __init__(self, opts: MeasureOptions, scratch: Path) -> None:
        self.opts = opts
        self.budget = opts.budget_s
        self.scratch = scratch
        self.sample: dict[str, np.ndarray] = {}
        self.dims: dict[str, int] = {}
        self._started = time.perf_counter()
        self._charged = 0.0  # seconds a fake timer says it spent (tests)
        self._run_s = 0.0  # the slowest warm-up run of one session seen so far
        self._medians: dict[str, float] = {}  # median ms per label of the last loop

    @property
    def spent(self) -> float:
        """Wall seconds since the timer was made: sessions, variants built, runs."""
        return time.perf_counter() - self._started + self._charged

    def charge(self, seconds: float) -> None:
        """Count ``seconds`` more (a fake's runs) or, negative, fewer (the result's check,
        which is not part of the budget) against the budget."""
        self._charged += seconds

    def remaining(self) -> float:
        return max(self.budget - self.spent, 0.0)

    def least_cost(self, sessions: int) -> float:
        """The fewest seconds a comparison of ``sessions`` models can take: ``min_runs``
        runs of each at the slowest run seen (0 before the first comparison)."""
        return self.opts.min_runs * sessions * self._run_s

    def median_ms(self, label: str) -> float | None:
        """The median run time in ms of ``label`` in the last timing loop (``"full"``
        after ``with_and_without``); None when it was not timed (a fake timer)."""
        return self._medians.get(label)

    def session(self, proto: onnx.ModelProto, label: str):
        prepared = prepare_model(proto, label, self.scratch)
        return make_session(
            prepared, self.opts.level, threads=self.opts.threads, providers=self.providers
        )

    def feeds_for(self, original, config: OptimizeConfig, feeds) -> dict | None:
        """The user's first sample, or generated inputs at the first of the check's
        candidate sizes the original runs on (the same sizes the check tries)."""
        session = self.session(original, "original")
        c = config.check
        distribution = FloatDistribution(
            c.input_distribution, mean=c.input_mean, std=c.input_std, low=c.input_low,
            high=c.input_high,
        )  # fmt: skip
        candidates: list[tuple[dict, dict]] = []
        if feeds:
            candidates.append((dict(feeds[0]), {}))
        else:
            free = input_dims(original)
            for k in range(CANDIDATES):
                dims = candidate_dims(free, c.shape_profiles()[0], k)
                sample = random_inputs(original, seed=c.seed, dims=dims, distribution=distribution)
                candidates.append((sample, dims))
        for sample, dims in candidates:
            try:
                session.run(None, inputs_for(session, sample))
            except Exception as exc:  # onnxruntime raises its own types; try the next sizes
                logger.debug("measured selection: the original does not run on %s: %s", dims, exc)
                continue
            self.sample, self.dims = sample, dims
            return sample
        return None

    def with_and_without(
        self, full: onnx.ModelProto, variants: Mapping[str, onnx.ModelProto], *, budget_s: float
    ) -> dict[str, PairedRatio]:
        """full / variant per variant, from one interleaved loop over all of them."""
        protos = {"full": full, **variants}
        times = self._timed(protos, budget_s)
        return {
            label: ratio
            for label in variants
            if (ratio := paired_ratio(times["full"], times[label])) is not None
        }

    def compare(self, fused: onnx.ModelProto, original, *, budget_s: float) -> PairedRatio | None:
        times = self._timed({"fused": fused, "original": original}, budget_s)
        return paired_ratio(times["fused"], times["original"])

    def _timed(self, protos: Mapping[str, onnx.ModelProto], budget_s: float) -> dict:
        start = time.perf_counter()
        sessions = {label: self.session(p, label) for label, p in protos.items()}
        inputs = {label: inputs_for(s, self.sample) for label, s in sessions.items()}
        warm = interleaved_ms(sessions, inputs, warmup=0, iters=_WARMUP)
        # Plan from the slowest warm-up, not the fastest: on a loaded machine a plan
        # from the fastest run overran a 60 s budget by up to 2.4x.
        slowest = {label: max(t) / 1000 for label, t in warm.items()}
        self._run_s = max(self._run_s, *slowest.values())
        iteration_s = sum(slowest.values())
        left = budget_s - (time.perf_counter() - start)
        runs = int(left / iteration_s) if iteration_s > 0 else _MAX_RUNS
        runs = max(self.opts.min_runs, min(runs, _MAX_RUNS))
        times = interleaved_ms(sessions, inputs, warmup=0, iters=runs)
        self._medians = {label: float(np.median(t)) for label, t in times.items() if len(t)}
        return times
