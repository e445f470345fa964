"""A report (``report.json``, version 2) as what its templates render: the job page's
report section on the dashboard and the standalone report.html are one view of it.

The facts (speed verdict, check, nodes, sizes) come from ``read_report`` and the one
verdict (``speed_verdict``, ``growth``); the detail sections (fusions, near misses, the
per-level latency table) are read defensively: they may grow or be absent. Fusions and
near misses are grouped (_view_groups.py); the error histograms and the slowest nodes
are charts (_view_charts.py). The charts and region pictures come from this package's
helpers, which escape every label, so their SVG is the only markup marked safe here.
No onnx here: the dashboard builds this view in the API process.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from autofusion.fusion_core.report._decisions import decision_source, store_counts
from autofusion.fusion_core.report._folding import left_alone_records
from autofusion.fusion_core.report._growth import growth
from autofusion.fusion_core.report._own_memory import optimize_memory_line, optimize_memory_phases
from autofusion.fusion_core.report._reader import ReportSummary, Speed, read_report
from autofusion.fusion_core.report._units import (
    bytes_text,
    duration_text,
    percent_text,
    saved_text,
)
from autofusion.fusion_core.report._verdict import MEDIANS_NOTE, SpeedVerdict, speed_verdict
from autofusion.fusion_core.report._view_charts import (
    error_histograms,
    latency_chart,
    op_type_chart,
    slowest_nodes,
)
from autofusion.fusion_core.report._view_groups import fusion_groups, near_miss_groups

__all__ = [
    "DASH",
    "MAX_MATCH_PICTURES",
    "fmt",
    "fmt_bytes",
    "report_view",
    "speed_class",
]

DASH = "—"
MAX_MATCH_PICTURES = 10


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def fmt(value: Any, digits: int = 4) -> str:
    """``digits`` significant digits, never an exponent: 126,000 µs/run reads as
    ``126000``, not ``1.26e+05`` (issue 27); tiny values (errors such as 4.2e-07) keep
    theirs."""
    number = _num(value)
    if number is None:
        return DASH
    if abs(number) >= 10**digits:
        return f"{number:.0f}"
    return f"{number:.{digits}g}"


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def speed_class(speed: Speed | None) -> str:
    """The CSS class of a verdict: speed-faster, speed-no-change, speed-slower, ..."""
    if speed is None or speed.verdict is None:
        return "speed-unknown"
    return SpeedVerdict(speed).css


# What the page says under a verdict that is not "faster", in plain words.
_SPEED_NOTES = {
    "slower": "The fused model is slower than the original on this machine.",
    "no measurable change": "The fused model is not measurably faster than the original "
    "on this machine: the interval includes 1.",
}


def _speed(verdict: SpeedVerdict | None) -> dict[str, Any] | None:
    """The one latency figure: the paired verdict, its ratio and interval; each model's
    median only as detail, with why they can differ."""
    if verdict is None:
        return None
    speed = verdict.speed
    return {
        "line": verdict.line(),
        "headline": verdict.headline,
        "speedup": f"{speed.speedup:.2f}×" if math.isfinite(speed.speedup) else DASH,
        "verdict": verdict.verdict,
        "css": verdict.css,
        "ratio": f"{speed.ratio:.3f}",
        "interval": verdict.interval or DASH,
        "runs": speed.runs if speed.runs is not None else DASH,
        "level": speed.level,
        "threads": speed.threads if speed.threads is not None else DASH,
        "note": _SPEED_NOTES.get(speed.verdict or ""),
        "time_change": verdict.time_change,
        "medians": verdict.medians,
        "medians_differ": verdict.medians_differ,
        "medians_note": MEDIANS_NOTE,
    }


def fmt_bytes(value: int | None) -> str:
    return DASH if value is None else bytes_text(value)


def _ms(value: Any) -> str:
    number = _num(value)
    return DASH if number is None else duration_text(number)


def _levels(profile: dict[str, Any]) -> list[dict[str, Any]]:
    """The profile's per-level detail: medians, the paired ratio, cold starts."""
    rows = []
    for comparison in map(_dict, _list(profile.get("latency"))):
        sessions = {s.get("label"): s for s in map(_dict, _list(comparison.get("sessions")))}
        paired = _dict(comparison.get("paired"))
        ratio = _num(paired.get("median")) or _num(comparison.get("ratio"))
        low, high = _num(paired.get("low")), _num(paired.get("high"))
        interval = f"{low:.3f}–{high:.3f}" if low is not None and high is not None else DASH
        original, fused = _dict(sessions.get("original")), _dict(sessions.get("fused"))
        rows.append(
            {
                "level": str(comparison.get("level") or "?"),
                "ratio": f"{ratio:.3f}" if ratio is not None else DASH,
                "interval": interval,
                "verdict": str(paired.get("verdict") or DASH),
                "speedup": f"{1 / ratio:.2f}×" if ratio else DASH,
                "original_ms": _ms(original.get("median_ms")),
                "fused_ms": _ms(fused.get("median_ms")),
                "original_create_ms": _ms(original.get("create_ms")),
                "fused_create_ms": _ms(fused.get("create_ms")),
            }
        )
    return rows


def _totals(gains: list[Any]) -> dict[str, str]:
    """Summed ``saved_us`` in words (a loss as a loss) and the ratio of summed after to
    summed before."""
    gains = [_dict(g) for g in gains]
    saved = [v for v in (_num(g.get("saved_us")) for g in gains) if v is not None]
    pairs = [(_num(g.get("before_us")), _num(g.get("after_us"))) for g in gains]
    pairs = [(b, a) for b, a in pairs if b is not None and a is not None]
    before = sum(b for b, _ in pairs)
    return {
        "saved": saved_text(sum(saved)) if saved else DASH,
        "ratio": fmt(sum(a for _, a in pairs) / before, 3) if pairs and before else DASH,
    }


def _validation(check: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": str(o.get("name")),
            "passed": bool(o.get("passed")),
            "max_abs": fmt(o.get("max_abs_diff", o.get("max_abs"))),
            "max_rel": fmt(o.get("max_rel_diff", o.get("max_rel"))),
            "rtol": fmt(o.get("rtol")),
            "atol": fmt(o.get("atol")),
            "mean_abs": fmt(o.get("mean_abs_diff")),
            "cosine": fmt(o.get("cosine_similarity"), 6),
            "mismatches": _mismatches(o),
        }
        for o in map(_dict, _list(check.get("outputs")))
    ]


def _mismatches(output: dict[str, Any]) -> str:
    """``3 of 512`` elements outside the tolerance; a dash in an older report."""
    bad, total = _num(output.get("mismatches")), _num(output.get("elements"))
    if bad is None or total is None:
        return DASH
    return f"{int(bad):,} of {int(total):,}"


_MEMORY_ROWS = (
    ("process peak", ""),
    ("resident after the runs", "resident_"),
    ("onnxruntime allocator peak", "allocator_peak_"),
)


def _memory(memory: dict[str, Any]) -> dict[str, Any] | None:
    """Process peak, what stays resident, and onnxruntime's allocator peak, with how
    each was measured; None when not profiled."""
    if not memory:
        return None
    rows = []
    for what, key in _MEMORY_ROWS:
        before, after = memory.get(f"{key}before_bytes"), memory.get(f"{key}after_bytes")
        both = isinstance(before, int) and isinstance(after, int) and before > 0
        rows.append(
            {
                "what": what,
                "before": fmt_bytes(before if isinstance(before, int) else None),
                "after": fmt_bytes(after if isinstance(after, int) else None),
                "change": percent_text((after - before) / before) if both else DASH,
            }
        )
    notes = [memory.get("measure"), memory.get("allocator_measure"), *_list(memory.get("errors"))]
    return {"rows": rows, "notes": [str(n) for n in notes if n]}


def _optimize_memory(report: dict[str, Any]) -> dict[str, Any] | None:
    """The optimizing process's own peak, per phase, with how it was measured and
    predicted; None when the report has none."""
    line = optimize_memory_line(report)
    if line is None:
        return None
    record = _dict(report.get("optimize_memory"))
    notes = [record.get("measure"), record.get("prediction")]
    return {
        "line": line,
        "phases": optimize_memory_phases(report),
        "notes": [str(n) for n in notes if n],
    }


def _measurement(record: dict[str, Any]) -> dict[str, Any] | None:
    """Measured selection: each group, kept or left out, with its paired ratio."""
    if not record:
        return None
    groups = []
    for g in map(_dict, _list(record.get("groups"))):
        ratio = _dict(g.get("ratio"))
        low, high = _num(ratio.get("low")), _num(ratio.get("high"))
        groups.append(
            {
                "group": str(g.get("group")),
                "fusions": g.get("fusions"),
                "kept": bool(g.get("kept")),
                "cached": bool(g.get("cached")),
                "source": decision_source(g) or "not measured",
                "source_kind": _source_kind(g),
                "ratio": fmt(_num(ratio.get("median")), 3) if ratio else DASH,
                "interval": f"{low:.3f}-{high:.3f}" if low is not None and high else DASH,
                "reason": str(g.get("reason")),
            }
        )
    return {
        "seconds": fmt(_num(record.get("seconds")), 1),
        "level": str(record.get("level")),
        "threads": record.get("threads"),
        "hits": _dict(record.get("cache")).get("hits"),
        "store": store_counts(record),
        "groups": groups,
        "fallback": record.get("fallback"),
        "error": record.get("error"),
    }


def _source_kind(group: dict[str, Any]) -> str:
    """store, measured or not measured (older reports: cached reads as store)."""
    if group.get("source"):
        return str(group["source"])
    if group.get("cached"):
        return "store"
    return "measured" if group.get("ratio") else "not measured"


def _fallback(fallback: dict[str, Any]) -> dict[str, Any] | None:
    """The fallback after a failed check: why, what was kept, what was dropped."""
    if not fallback:
        return None
    dropped = [
        {
            "pattern": str(r.get("pattern")),
            "nodes": [str(n) for n in _list(r.get("nodes"))],
            "error": str(r.get("error")),
        }
        for r in map(_dict, _list(fallback.get("dropped")))
    ]
    unchanged = bool(fallback.get("unchanged"))
    kept = (
        "no set of fusions passed, so the model is stored as it came"
        if unchanged
        else f"{fallback.get('kept')} fusion(s) passed and are kept; {len(dropped)} dropped"
    )
    return {"reason": str(fallback.get("reason")), "kept": kept, "dropped": dropped}


def _check(report: dict[str, Any], summary: ReportSummary) -> dict[str, Any]:
    check = _dict(report.get("check"))
    return {
        "checked": summary.check_passed is not None,
        "check_passed": bool(summary.check_passed),
        "check_error": summary.check_reason or summary.check_error,
        # profiles the check added and left out: the original cannot run at those sizes
        "check_left_out": [str(s) for s in _list(check.get("skipped"))],
        "max_abs": fmt(summary.max_abs_diff),
        "validation": _validation(check),
        "histograms": error_histograms(check),
    }


def _steps(report: dict[str, Any]) -> dict[str, Any]:
    """What did not go as planned: the fallback, bugs taken back, rollbacks, and the
    parts left as they are (what folding left unfolded too, as in report.md)."""
    rows = map(_dict, _list(report.get("rollbacks")))
    return {
        "fallback": _fallback(_dict(report.get("fallback"))),
        "rejected": [
            {"step": str(r.get("step")), "name": str(r.get("name")), "failed": str(r.get("failed"))}
            for r in map(_dict, _list(report.get("rejected")))
        ],
        "left_alone": [
            {"what": str(r.get("what")), "nodes": r.get("nodes"), "reason": str(r.get("reason"))}
            for r in map(_dict, left_alone_records(report))
        ],
        "rollbacks": [
            {
                "pattern": str(r.get("pattern")),
                "nodes": [str(n) for n in _list(r.get("nodes"))],
                "error": str(r.get("error")),
            }
            for r in rows
        ],
    }


def report_view(
    report: dict[str, Any],
    *,
    regions: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """What the templates render of ``report``; ``regions`` are the region pictures
    (``regions_from_data``), None when there are none."""
    summary = read_report(report)
    profile = _dict(report.get("profile"))
    applied = [f for f in _list(report.get("applied")) if isinstance(f, dict)]
    misses = _list(report.get("near_misses"))
    groups = fusion_groups(applied, regions if applied else None, _totals)
    return {
        "model": report.get("model"),
        "target": summary.target,
        "speed": _speed(speed_verdict(report)),
        "growth": [asdict(g) for g in growth(report)],
        "levels": _levels(profile),
        "measurement": _measurement(_dict(report.get("measurement"))),
        **_check(report, summary),
        **_steps(report),
        "nodes_before": summary.nodes_before,
        "nodes_after": summary.nodes_after,
        "subgraph_nodes": summary.subgraph_nodes,
        "fusion_count": len(applied),
        "fusions": groups,
        "pictured": sum(len(g["examples"]) + len(g["more_examples"]) for g in groups),
        "has_pictures": regions is not None,
        "near_misses": near_miss_groups(misses),
        "near_miss_count": len(misses),
        "op_chart": op_type_chart(profile),
        "latency_chart": latency_chart(profile),
        "memory": _memory(_dict(report.get("memory"))),
        "optimize_memory": _optimize_memory(report),
        "slowest": slowest_nodes(profile),
        "written": _written(report),
    }


def _written(report: dict[str, Any]) -> str | None:
    """What the written model leaves out of its declarations (pipeline/written.py), in
    the pre-passes' words; None when it declares every inferred shape."""
    lines = [str(p) for p in _list(report.get("prepasses")) if str(p).startswith("written form:")]
    return lines[-1].removeprefix("written form: ") if lines else None
