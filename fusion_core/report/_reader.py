"""The one typed reader of a report: what the worker, the dashboard and the CI client
take from ``report.json``.

Each consumer once read its own keys (the CI client looked for a ``speedup`` no report
had, and its speed gate could never pass). Now they all call ``read_report`` and use
its fields; the keys are named here only, next to ``speed_section``, which writes the
``speed`` entry that ``build_report`` puts in every report. A test builds real reports
and reads them back, so a renamed key fails there, not in production.

Reports written before the ``speed`` entry existed still read: the speed then comes
from the profile's ratio of medians, with no interval and no verdict.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autofusion.fusion_core.profiling.stats import VERDICTS
from autofusion.fusion_core.report._units import change_words

__all__ = [
    "BODIES",
    "DEPLOYMENT_LEVEL",
    "ReportSummary",
    "Speed",
    "measured_speed",
    "read_report",
    "speed_section",
]

# The level a user who deploys with onnxruntime gets, and so the one the verdict is on.
DEPLOYMENT_LEVEL = "ORT_ENABLE_ALL"
# What the nodes counted apart from the main graph's are, in every rendering.
BODIES = "If/Loop/Scan bodies"


@dataclass(frozen=True)
class Speed:
    """fused / original run time at ``level`` (below 1: faster), as measured."""

    level: str
    ratio: float
    low: float | None = None  # the interval; None in reports older than the verdict
    high: float | None = None
    confidence: float | None = None
    runs: int | None = None
    verdict: str | None = None  # one of fusion_core.profiling.stats.VERDICTS
    threads: int | None = None

    @property
    def speedup(self) -> float:
        """original / fused: above 1 is faster."""
        return 1.0 / self.ratio if self.ratio > 0 else math.inf

    def describe(self) -> str:
        """The one line every rendering states (fusion_core/report/_verdict.py), e.g.
        ``20% faster (1.25x): fused/original 0.800 (95% interval 0.780-0.830, 20 paired
        runs, ORT_ENABLE_ALL, 1 thread)``."""
        head = f"{change_words(self.ratio, self.verdict)} ({self.speedup:.2f}x)"
        extras = []
        if self.low is not None and self.high is not None:
            share = f"{self.confidence:.0%} " if self.confidence else ""
            extras.append(f"{share}interval {self.low:.3f}-{self.high:.3f}")
        if self.runs:
            extras.append(f"{self.runs} paired runs")
        extras.append(self.level)
        if self.threads:
            extras.append(f"{self.threads} thread{'s' if self.threads != 1 else ''}")
        return f"{head}: fused/original {self.ratio:.3f} ({', '.join(extras)})"


@dataclass(frozen=True)
class ReportSummary:
    """The facts consumers act on; None where the report has no such measurement."""

    target: str | None
    fusions: int
    counts: dict[str, int]  # fusions per pattern
    nodes_before: int | None  # the main graph's (If/Loop/Scan bodies apart, below)
    nodes_after: int | None
    check_passed: bool | None  # None: the check was skipped
    check_failure: str | None  # fusion_core.validate's failure kind, when it failed
    check_error: str | None  # the check's own words, when it failed
    check_reason: str | None  # why it failed in its kind's words (fusion_core.validate)
    max_abs_diff: float | None
    speed: Speed | None
    size_before_bytes: int | None
    size_after_bytes: int | None
    peak_memory_before_bytes: int | None
    peak_memory_after_bytes: int | None
    timings_s: dict[str, float]  # seconds per phase of optimize
    # The check failed and the run fell back (the report's ``fallback``): why, in words
    fallback_reason: str | None = None
    fallback_dropped: int = 0  # fusions the fallback took out
    fallback_unchanged: bool = False  # no set of fusions passed: the model as it came
    rejected: int = 0  # steps taken back as bugs of autofusion (the report's ``rejected``)
    # The nodes inside If/Loop/Scan bodies; None: no body (or a report from before they
    # were counted apart, when nodes_before/after included them)
    subgraph_nodes_before: int | None = None
    subgraph_nodes_after: int | None = None
    # Sizes the check added and left out, the original cannot run there (the report's
    # ``check.skipped``, a job summary's ``check.left_out``): a passed check says so
    check_left_out: tuple[str, ...] = ()

    @property
    def subgraph_nodes(self) -> str | None:
        """``"0 -> 6 in If/Loop/Scan bodies"``, or None when the models have no body."""
        before, after = self.subgraph_nodes_before, self.subgraph_nodes_after
        if before is None and after is None:
            return None
        return f"{_or_unknown(before)} -> {_or_unknown(after)} in {BODIES}"


def speed_section(profile: Mapping[str, Any] | None, threads: int | None = None) -> dict | None:
    """The report's ``speed`` entry from a ``ProfileReport.to_dict()``: the paired
    ratio at the deployment level (else the first level measured); None unprofiled."""
    if not isinstance(profile, Mapping):
        return None
    levels = [c for c in profile.get("latency") or [] if isinstance(c, Mapping)]
    chosen = next((c for c in levels if c.get("level") == DEPLOYMENT_LEVEL), None)
    chosen = chosen or (levels[0] if levels else None)
    if chosen is None:
        return None
    paired = chosen.get("paired")
    if threads is None:
        threads = _int((profile.get("options") or {}).get("threads"))
    if isinstance(paired, Mapping) and _num(paired.get("median")):
        median = float(paired["median"])
        return {
            "level": chosen.get("level"),
            "ratio": median,
            "speedup": 1.0 / median,
            "low": _num(paired.get("low")),
            "high": _num(paired.get("high")),
            "confidence": _num(paired.get("confidence")),
            "runs": _int(paired.get("runs")),
            "verdict": paired.get("verdict") if paired.get("verdict") in VERDICTS else None,
            "threads": threads,
        }
    ratio = _num(chosen.get("ratio"))
    if not ratio:
        return None
    return {
        "level": chosen.get("level"),
        "ratio": ratio,
        "speedup": 1.0 / ratio,
        "low": None,
        "high": None,
        "confidence": None,
        "runs": None,
        "verdict": None,
        "threads": threads,
    }


def measured_speed(measurement: Mapping[str, Any] | None) -> dict | None:
    """The ``speed`` entry from measured selection's final comparison with the original
    (the verdict of an unprofiled measured job); None without one."""
    if not isinstance(measurement, Mapping) or not isinstance(measurement.get("final"), Mapping):
        return None
    profile = {
        "options": {"threads": measurement.get("threads")},
        "latency": [{"level": measurement.get("level"), "paired": measurement["final"]}],
    }
    return speed_section(profile)


def read_report(report: Mapping[str, Any]) -> ReportSummary:
    """The summary of a report dict (a stored one, of any version since 2)."""
    check = _map(report.get("check"))
    nodes = _map(report.get("nodes"))
    speed = report.get("speed")
    if not isinstance(speed, Mapping):  # a report from before the speed entry
        speed = speed_section(_map(report.get("profile")) or None)
    size, memory = _map(report.get("size")), _map(report.get("memory"))
    fallback = _map(report.get("fallback"))
    counts = {k: v for k, v in _map(report.get("fusions")).items() if _int(v) is not None}
    timings = {k: float(v) for k, v in _map(report.get("timings_s")).items() if _num(v) is not None}
    return ReportSummary(
        target=report.get("target") if isinstance(report.get("target"), str) else None,
        fusions=sum(counts.values()),
        counts=counts,
        timings_s=timings,
        nodes_before=_int(nodes.get("before")),
        nodes_after=_int(nodes.get("after")),
        subgraph_nodes_before=_int(_map(nodes.get("subgraphs")).get("before")),
        subgraph_nodes_after=_int(_map(nodes.get("subgraphs")).get("after")),
        check_passed=bool(check.get("passed")) if check else None,
        check_failure=check.get("failure") if isinstance(check.get("failure"), str) else None,
        check_error=check.get("error") if isinstance(check.get("error"), str) else None,
        check_reason=check.get("reason") if isinstance(check.get("reason"), str) else None,
        max_abs_diff=_num(check.get("max_abs_diff")),
        speed=_speed(speed),
        size_before_bytes=_int(size.get("before_bytes")),
        size_after_bytes=_int(size.get("after_bytes")),
        peak_memory_before_bytes=_int(memory.get("before_bytes")),
        peak_memory_after_bytes=_int(memory.get("after_bytes")),
        fallback_reason=fallback.get("reason") if isinstance(fallback.get("reason"), str) else None,
        fallback_dropped=len(fallback.get("dropped") or []) if fallback else 0,
        fallback_unchanged=bool(fallback.get("unchanged")),
        rejected=len(report.get("rejected") or []),
        check_left_out=tuple(
            str(s) for s in (check.get("skipped") or check.get("left_out") or []) if s
        ),
    )


def _speed(entry: Mapping[str, Any] | None) -> Speed | None:
    if not isinstance(entry, Mapping) or not _num(entry.get("ratio")):
        return None
    verdict = entry.get("verdict")
    return Speed(
        level=str(entry.get("level") or DEPLOYMENT_LEVEL),
        ratio=float(entry["ratio"]),
        low=_num(entry.get("low")),
        high=_num(entry.get("high")),
        confidence=_num(entry.get("confidence")),
        runs=_int(entry.get("runs")),
        verdict=verdict if verdict in VERDICTS else None,
        threads=_int(entry.get("threads")),
    )


def _or_unknown(value: int | None) -> str:
    return "?" if value is None else str(value)


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
