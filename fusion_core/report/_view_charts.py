"""The report's measurements that read better as pictures: each output's error
histogram (``check.outputs[].histogram`` over ``check.histogram_edges``), the slowest
nodes of each model (``profile.nodes.{original,fused}.nodes``), the time per op type and
each session's latency.

The SVG comes from the chart helpers (_charts.py), which escape every label (node
and output names come from the model): it is the only markup marked safe here.
"""

from __future__ import annotations

import math
from typing import Any

from markupsafe import Markup

from autofusion.fusion_core.report._charts import grouped_bars, histogram

__all__ = [
    "MAX_HISTOGRAMS",
    "TOP_NODES",
    "error_histograms",
    "latency_chart",
    "op_type_chart",
    "slowest_nodes",
]

MAX_HISTOGRAMS = 8  # outputs drawn; a model with more lists the rest in the table only
TOP_NODES = 10
_MAX_OP_TYPES = 25  # bars of the op-type chart


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _edge_label(edge: float, last: bool) -> str:
    if last:
        return f"≥{edge:g}"
    return "<1e-08" if edge == 0 else f"{edge:g}"


def _bins(edges: list[float], counts: list[int]) -> list[tuple[str, int]]:
    """``[0, 1e-8)`` as "<1e-08" (exact matches in it), then each decade by its lower
    edge, the last one (``≥1``) open-ended."""
    return [
        (_edge_label(edge, k == len(edges) - 1), count)
        for k, (edge, count) in enumerate(zip(edges, counts, strict=True))
    ]


def _histogram(chart_id: str, output: dict[str, Any], edges: list[float]) -> Markup | None:
    counts = [c for c in _list(output.get("histogram")) if isinstance(c, int)]
    if not edges or len(counts) != len(edges) or not any(counts):
        return None
    atol = _num(output.get("atol"))
    marked = next((k for k, edge in enumerate(edges) if atol is not None and edge >= atol), None)
    label = f"|error| ≥ atol {atol:g}" if marked is not None and atol is not None else ""
    name = str(output.get("name"))
    svg = histogram(
        chart_id,
        f"{name}: elements per |fused - original| decade (log scale)",
        _bins(edges, counts),
        marked_from=marked,
        marked_label=label,
    )
    return Markup(svg)  # histogram escapes every label


def error_histograms(check: dict[str, Any]) -> list[dict[str, Any]]:
    """One chart per compared output (the first ``MAX_HISTOGRAMS``)."""
    edges = [e for e in (_num(v) for v in _list(check.get("histogram_edges"))) if e is not None]
    charts = []
    for k, output in enumerate(map(_dict, _list(check.get("outputs"))[:MAX_HISTOGRAMS])):
        svg = _histogram(f"chart-error-{k}", output, edges)
        if svg is not None:
            charts.append({"name": str(output.get("name")), "svg": svg})
    return charts


def _slowest(chart_id: str, title: str, node_profile: Any) -> Markup | None:
    profile = _dict(node_profile)
    runs = max(int(_num(profile.get("runs")) or 1), 1)
    timed = [
        (f"{n.get('name') or '(unnamed)'} ({n.get('op_type')})", total / runs)
        for n in map(_dict, _list(profile.get("nodes")))
        if (total := _num(n.get("total_us"))) is not None
    ]
    if not timed:
        return None
    timed.sort(key=lambda pair: -pair[1])
    rows = [(label, [value]) for label, value in timed[:TOP_NODES]]
    svg = grouped_bars(chart_id, title, rows, ["µs per run"], "µs", label_width=230, bar_width=200)
    return Markup(svg)  # grouped_bars escapes every label


def slowest_nodes(profile: dict[str, Any]) -> dict[str, Markup | None] | None:
    """The ``TOP_NODES`` slowest nodes of each model, as charts; None when not profiled."""
    nodes = _dict(profile.get("nodes"))
    charts = {
        "original": _slowest(
            "chart-slowest-original", "slowest nodes, original", nodes.get("original")
        ),
        "fused": _slowest("chart-slowest-fused", "slowest nodes, fused", nodes.get("fused")),
    }
    return charts if any(charts.values()) else None


def _op_times(node_profile: Any) -> dict[str, float]:
    profile = _dict(node_profile)
    runs = max(int(_num(profile.get("runs")) or 1), 1)
    return {
        str(o.get("op_type")): (_num(o.get("total_us")) or 0.0) / runs
        for o in map(_dict, _list(profile.get("op_types")))
    }


def op_type_chart(profile: dict[str, Any]) -> Markup | None:
    """Each op type's time per run in both models, the slowest first."""
    nodes = _dict(profile.get("nodes"))
    before, after = _op_times(nodes.get("original")), _op_times(nodes.get("fused"))
    if not before and not after:
        return None
    ops = sorted(set(before) | set(after), key=lambda op: -(before.get(op, 0) + after.get(op, 0)))
    rows = [(op, [before.get(op), after.get(op)]) for op in ops[:_MAX_OP_TYPES]]
    svg = grouped_bars("chart-op-types", "time per op type", rows, ["original", "fused"], "µs/run")
    return Markup(svg)  # grouped_bars escapes every label


def latency_chart(profile: dict[str, Any]) -> Markup | None:
    """Each session's median and p90 run time per level (the detail under the verdict)."""
    rows = [
        (f"{c.get('level')} {s.get('label')}", [_num(s.get("median_ms")), _num(s.get("p90_ms"))])
        for c in map(_dict, _list(profile.get("latency")))
        for s in map(_dict, _list(c.get("sessions")))
    ]
    if not rows:
        return None
    svg = grouped_bars("chart-latency", "latency", rows, ["median", "p90"], "ms")
    return Markup(svg)  # grouped_bars escapes every label
