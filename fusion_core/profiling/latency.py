"""Profiling: how fast the original and the fused model run in onnxruntime, and where
the time goes.

Latency is measured so that a comparison is fair on a shared, noisy machine:

* every session gets the same fixed intra-op thread count and thread spinning off
  (``session.intra_op.allow_spinning = 0``), so sessions measured side by side do not
  burn each other's CPUs while they wait;
* warm-up runs come first (first runs allocate and pre-pack);
* runs are interleaved: each iteration runs every session once, rotating which goes
  first, so drift of the machine (another job, a frequency change) hits all alike;
* the result is the median and p90 per session, the ratio of the two medians, and the
  paired ratio: fused / original within each iteration, its median, a 95% interval
  and a verdict (faster / no measurable change / slower; fusion_core/profiling/stats.py).

It is measured at onnxruntime's default level, ``ORT_ENABLE_ALL`` (what a user who
deploys with onnxruntime gets), and with onnxruntime's optimizations off,
``ORT_DISABLE_ALL`` (our fusion alone). Session creation time (a cold start) is timed
per session too, from the file the session reads: for a model in one file with big
weights that is its copy with a data file (``validate.session_file``: the same graph and
weights, which onnxruntime maps instead of parsing the whole file), so the parse of the
one file itself is not in it.

Per-node times come from onnxruntime's own profiler at ``ORT_DISABLE_ALL`` (so the node
names of the model survive) and are aggregated per op type, and per fused region: the
fused node's time against the summed times of the original nodes it replaced (read
from the ``autofusion.*`` provenance on each fused node). The profiler adds a few
microseconds to every kernel, so these times break a run down; they do not replace the
latency, which comes from untraced runs (and is what a region's ratio should be read
against when kernels are tiny). Memory is what onnxruntime's allocator reports in the
same trace (see ``MemoryStats``).
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import statistics
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort

from autofusion.fusion_core import provenance
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.profiling._trace import (
    MemoryStats,
    NodeProfile,
    NodeTime,
    OpTypeTime,
    PreparedModel,
    inputs_for,
    make_session,
    parse_trace,
    prepare_model,
    read_trace,
    timed_run,
)
from autofusion.fusion_core.profiling.stats import PairedRatio, paired_ratio
from autofusion.fusion_core.validate import random_inputs

__all__ = [
    "LEVELS",
    "LatencyComparison",
    "MemoryStats",
    "NodeProfile",
    "NodeTime",
    "OpTypeTime",
    "PairedRatio",
    "PatternTime",
    "ProfileOptions",
    "ProfileReport",
    "RegionTime",
    "SessionLatency",
    "interleaved_ms",
    "measure_latency",
    "parse_trace",
    "pattern_times",
    "profile_models",
    "profile_nodes",
    "read_trace",
    "region_times",
    "write_trace",
]

logger = logging.getLogger(__name__)

LEVELS = ("ORT_ENABLE_ALL", "ORT_DISABLE_ALL")
Feeds = dict[str, np.ndarray]
ModelLike = onnx.ModelProto | ir.Model | str | os.PathLike


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """How to measure. Inputs are generated from ``seed`` and ``dims`` unless given."""

    threads: int = 1
    warmup: int = 3
    iters: int = 20
    node_runs: int = 5
    providers: tuple[str, ...] = ("CPUExecutionProvider",)
    levels: tuple[str, ...] = LEVELS
    seed: int = 0
    dims: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("threads", "iters", "node_runs"):
            if getattr(self, name) < 1:
                raise ConfigError(f"profile option {name} must be at least 1")
        if self.warmup < 0:
            raise ConfigError("profile option warmup must not be negative")
        unknown = [lv for lv in self.levels if not hasattr(ort.GraphOptimizationLevel, lv)]
        if unknown or not self.levels:
            raise ConfigError(f"unknown onnxruntime optimization levels {unknown or '(none)'}")
        missing = [p for p in self.providers if p not in ort.get_available_providers()]
        if missing or not self.providers:
            raise ConfigError(
                f"execution providers {missing or '(none)'} are not available",
                hint=f"this onnxruntime has {ort.get_available_providers()}",
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {
            "providers": list(self.providers),
            "levels": list(self.levels),
            "dims": {str(k): int(v) for k, v in self.dims.items()},
        }


@dataclass(frozen=True)
class SessionLatency:
    """One session's run times (ms) over the measured iterations, after warm-up."""

    label: str
    create_ms: float
    median_ms: float
    p90_ms: float
    min_ms: float
    runs: int

    def to_dict(self) -> dict[str, Any]:
        return {k: _finite(v) if isinstance(v, float) else v for k, v in asdict(self).items()}


@dataclass
class LatencyComparison:
    """Sessions measured side by side at one onnxruntime optimization level."""

    level: str
    sessions: list[SessionLatency]
    # fused / original per interleaved iteration, with its interval and verdict
    # (fusion_core/profiling/stats.py); None without both sessions.
    paired: PairedRatio | None = None

    @property
    def ratio(self) -> float | None:
        """fused / original median run time (below 1: fused is faster); None when
        there is nothing to compare."""
        by_label = {s.label: s.median_ms for s in self.sessions}
        if "original" not in by_label or "fused" not in by_label:
            return None
        return _finite(by_label["fused"] / by_label["original"]) if by_label["original"] else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "level": self.level,
            "ratio": self.ratio,
            "paired": self.paired.to_dict() if self.paired else None,
            "sessions": [s.to_dict() for s in self.sessions],
        }


@dataclass(frozen=True)
class RegionTime:
    """One fused region: its fused node(s)' kernel time against the summed kernel
    times of the original nodes they replaced, both in µs per run.

    ``unmatched`` names nodes with no kernel in their trace: Constant nodes (onnxruntime
    turns them into initializers), unnamed original nodes (provenance calls them
    ``<OpType>``) and calls of model-local functions (onnxruntime inlines them, so the
    call has no kernel of its own). A side with no kernel at all is None.
    """

    pattern: str
    fused_nodes: tuple[str, ...]
    replaced_nodes: tuple[str, ...]
    before_us: float | None
    after_us: float | None
    unmatched: tuple[str, ...] = ()

    @property
    def ratio(self) -> float | None:
        return _ratio(self.after_us, self.before_us)

    def to_dict(self) -> dict[str, Any]:
        return {
            "pattern": self.pattern,
            "fused_nodes": list(self.fused_nodes),
            "replaced_nodes": list(self.replaced_nodes),
            "before_us": _finite(self.before_us),
            "after_us": _finite(self.after_us),
            "ratio": self.ratio,
            "unmatched": list(self.unmatched),
        }


@dataclass(frozen=True)
class PatternTime:
    """The regions of one pattern together; a region missing a side counts on neither."""

    pattern: str
    regions: int
    before_us: float
    after_us: float

    @property
    def ratio(self) -> float | None:
        return _ratio(self.after_us, self.before_us)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"ratio": self.ratio}


@dataclass
class ProfileReport:
    """Everything one profile measured; ``to_dict`` is plain, finite JSON data."""

    options: ProfileOptions
    latency: list[LatencyComparison]
    original_nodes: NodeProfile
    fused_nodes: NodeProfile | None = None
    regions: list[RegionTime] = field(default_factory=list)
    patterns: list[PatternTime] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "options": self.options.to_dict(),
            "latency": [c.to_dict() for c in self.latency],
            "nodes": {
                "original": self.original_nodes.to_dict(),
                "fused": self.fused_nodes.to_dict() if self.fused_nodes else None,
            },
            "regions": [r.to_dict() for r in self.regions],
            "patterns": [p.to_dict() for p in self.patterns],
        }


def profile_models(
    original: ModelLike,
    fused: ModelLike | None = None,
    *,
    feeds: Feeds | None = None,
    options: ProfileOptions | None = None,
    trace_path: str | os.PathLike | None = None,
    trace_runs: int = 3,
) -> ProfileReport:
    """Profile one model, or an original and its fused model side by side.

    Paths are loaded with ``fusion_core.ir.load_model``, so external data outside the
    model's folder is refused (UnsafeModelError) before onnxruntime opens anything.
    Each model is prepared once for every session of the profile (``prepare_model``): a
    model in one file with big weights is copied with its weights in a data file to a
    scratch folder (``validate.session_file``), removed after. ``trace_path``: also keep
    onnxruntime's raw trace of ``trace_runs`` runs of the fused model (else the
    original) there (``write_trace``, the same inputs); a failure costs the trace only.
    """
    options = options or ProfileOptions()
    with tempfile.TemporaryDirectory(prefix="autofusion-profile-") as scratch:
        models = {"original": prepare_model(original, "original", Path(scratch))}
        if fused is not None:
            models["fused"] = prepare_model(fused, "fused", Path(scratch))
        if feeds is None:
            feeds = random_inputs(models["original"].proto, seed=options.seed, dims=options.dims)
        latency = [
            measure_latency(models, feeds, level=lv, options=options) for lv in options.levels
        ]
        before = profile_nodes(models["original"], feeds, options=options)
        report = ProfileReport(options, latency, before)
        if fused is not None:
            report.fused_nodes = profile_nodes(models["fused"], feeds, options=options)
            report.regions = region_times(models["fused"].proto, before, report.fused_nodes)
            report.patterns = pattern_times(report.regions)
        if trace_path is not None:
            traced = models.get("fused", models["original"])
            _keep_trace(traced, feeds, trace_path, runs=trace_runs, options=options)
    return report


def _keep_trace(
    model: PreparedModel,
    feeds: Feeds,
    path: str | os.PathLike,
    *,
    runs: int,
    options: ProfileOptions,
) -> None:
    try:  # the trace is an extra: a failure here must not cost the profile
        write_trace(model, path, runs=runs, feeds=feeds, options=options)
    except Exception:
        logger.exception("could not keep the profiler trace")


def measure_latency(
    models: dict[str, Any], feeds: Feeds, *, level: str, options: ProfileOptions
) -> LatencyComparison:
    """Time session creation, then run every session interleaved (see module doc)."""
    with tempfile.TemporaryDirectory(prefix="autofusion-profile-") as scratch:
        prepared = {label: prepare_model(m, label, Path(scratch)) for label, m in models.items()}
        sessions, create_ms = {}, {}
        for label, model in prepared.items():
            start = time.perf_counter()
            sessions[label] = _session(model, level, options)
            create_ms[label] = (time.perf_counter() - start) * 1000
        inputs = {label: inputs_for(s, feeds) for label, s in sessions.items()}
        labels = list(sessions)
        times = interleaved_ms(sessions, inputs, warmup=options.warmup, iters=options.iters)
    comparison = LatencyComparison(level, [_summary(lb, create_ms[lb], times[lb]) for lb in labels])
    if "original" in times and "fused" in times:
        comparison.paired = paired_ratio(times["fused"], times["original"])
    for session in comparison.sessions:
        logger.debug("%s %s: median %.3f ms", level, session.label, session.median_ms)
    return comparison


def interleaved_ms(
    sessions: dict[str, ort.InferenceSession],
    inputs: dict[str, Feeds],
    *,
    warmup: int,
    iters: int,
) -> dict[str, list[float]]:
    """Run times (ms) per session over ``iters`` iterations after ``warmup``: each
    iteration runs every session once, rotating which goes first, so entry ``i`` of
    every list was measured side by side (what ``paired_ratio`` pairs)."""
    labels = list(sessions)
    times: dict[str, list[float]] = {label: [] for label in labels}
    for i in range(warmup + iters):
        k = i % len(labels)
        for label in labels[k:] + labels[:k]:
            elapsed = timed_run(sessions[label], inputs[label], label)
            if i >= warmup:
                times[label].append(elapsed * 1000)
    return times


def profile_nodes(
    model: Any, feeds: Feeds, *, options: ProfileOptions, level: str = "ORT_DISABLE_ALL"
) -> NodeProfile:
    """Per-node kernel times from onnxruntime's profiler over ``options.node_runs`` runs
    (after ``options.warmup`` runs that are dropped from the trace)."""
    with tempfile.TemporaryDirectory(prefix="autofusion-trace-") as scratch:
        runs = options.warmup + options.node_runs
        trace = _traced_runs(model, feeds, runs, options, level, Path(scratch))
        events = read_trace(trace)
    return parse_trace(events, skip_runs=options.warmup, level=level)


def write_trace(
    model: ModelLike,
    path: str | os.PathLike,
    *,
    runs: int,
    feeds: Feeds | None = None,
    options: ProfileOptions | None = None,
    level: str = "ORT_DISABLE_ALL",
) -> None:
    """onnxruntime's raw profiler trace of ``runs`` runs of ``model`` (for
    chrome://tracing or Perfetto), written to ``path``; the same sessions and inputs as
    ``profile_nodes`` (inputs from ``options.seed`` and ``options.dims`` unless given)."""
    options = options or ProfileOptions()
    with tempfile.TemporaryDirectory(prefix="autofusion-trace-") as scratch:
        prepared = prepare_model(model, "model", Path(scratch))
        if feeds is None:
            feeds = random_inputs(prepared.proto, seed=options.seed, dims=options.dims)
        trace = _traced_runs(prepared, feeds, runs, options, level, Path(scratch))
        shutil.move(trace, path)  # the scratch folder may be on another file system


def _traced_runs(
    model: Any, feeds: Feeds, runs: int, options: ProfileOptions, level: str, scratch: Path
) -> str:
    """Run ``model`` ``runs`` times under the profiler; the trace file's path (in scratch)."""
    prepared = prepare_model(model, "model", scratch)
    session = _session(prepared, level, options, profile_prefix=str(scratch / "ort"))
    inputs = inputs_for(session, feeds)
    for _ in range(runs):
        timed_run(session, inputs, prepared.label)
    return session.end_profiling()


def region_times(
    fused_model: onnx.ModelProto, before: NodeProfile, after: NodeProfile
) -> list[RegionTime]:
    """One record per fused region of ``fused_model``: fused nodes that share a pattern
    and the same replaced nodes (a horizontal merge emits several) form one region."""
    groups: dict[tuple[str, tuple[str, ...]], list[str]] = defaultdict(list)
    for node in fused_model.graph.node:
        props = provenance.metadata(node)
        replaced = provenance.replaced_nodes(props)
        if replaced is not None:
            groups[(provenance.pattern(props) or "", tuple(replaced))].append(node.name)
    before_us_of, after_us_of = _per_run(before), _per_run(after)
    regions = []
    for (pattern, replaced), fused_nodes in groups.items():
        after_us, missing_after = _sum_times(after_us_of, fused_nodes)
        before_us, missing_before = _sum_times(before_us_of, replaced)
        unmatched = tuple(missing_after + missing_before)
        regions.append(
            RegionTime(pattern, tuple(fused_nodes), replaced, before_us, after_us, unmatched)
        )
    return regions


def pattern_times(regions: list[RegionTime]) -> list[PatternTime]:
    """Regions summed per pattern, most original time first."""
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for region in regions:
        entry = totals[region.pattern]
        entry[0] += 1
        if region.before_us is not None and region.after_us is not None:
            entry[1] += region.before_us
            entry[2] += region.after_us
    patterns = [PatternTime(p, int(n), b, a) for p, (n, b, a) in totals.items()]
    return sorted(patterns, key=lambda p: (-p.before_us, p.pattern))


def _session(
    model: PreparedModel, level: str, options: ProfileOptions, profile_prefix: str | None = None
) -> ort.InferenceSession:
    return make_session(
        model,
        level,
        threads=options.threads,
        providers=options.providers,
        profile_prefix=profile_prefix,
    )


def _summary(label: str, create_ms: float, times_ms: list[float]) -> SessionLatency:
    return SessionLatency(
        label=label,
        create_ms=create_ms,
        median_ms=float(statistics.median(times_ms)),
        p90_ms=float(np.percentile(times_ms, 90)),
        min_ms=float(min(times_ms)),
        runs=len(times_ms),
    )


def _sum_times(per_run: dict[str, float], names: Sequence[str]) -> tuple[float | None, list[str]]:
    """The summed per-run time of the ``names`` found, and the names not found."""
    found = [per_run[n] for n in names if n in per_run]
    missing = [n for n in names if n not in per_run]
    return (float(sum(found)) if found else None), missing


def _per_run(profile: NodeProfile) -> dict[str, float]:
    return {n.name: n.total_us / max(profile.runs, 1) for n in profile.nodes}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return _finite(numerator / denominator)


def _finite(value: float | None) -> float | None:
    return float(value) if value is not None and math.isfinite(value) else None
