"""The report as one self-contained HTML page: no scripts, no external styles or fonts.

Charts and region pictures are inline SVG; every string from the report or the models
(node names, reasons, errors) goes through ``html.escape``.
"""

from __future__ import annotations

import json
from html import escape
from typing import Any

import onnx

from autofusion.fusion_core.report._charts import grouped_bars
from autofusion.fusion_core.report._folding import left_alone_records
from autofusion.fusion_core.report._footprint import bytes_text, memory_line, size_line
from autofusion.fusion_core.report._graph import GraphIndex, region_svg
from autofusion.fusion_core.report._provenance import final_nodes
from autofusion.fusion_core.report._region_data import example_fusions, with_shapes

__all__ = ["render_html"]

_MAX_ROWS = 1000
_MAX_OP_TYPES = 25

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;color:#222;max-width:1200px}
table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #ccc;padding:2px 8px;
text-align:left;vertical-align:top}th{background:#f3f3f3}.pass{color:#1a7f37}
.fail{color:#c62828;font-weight:bold}code,pre{font-size:90%}.pair{display:flex;gap:2em;
align-items:flex-start;overflow-x:auto}svg text{font-size:11px;font-family:sans-serif}
svg .edge{fill:none;stroke:#888}svg .fused rect{fill:#ffe0b2;stroke:#e65100}
svg .near rect{fill:#eceff1;stroke:#90a4ae}svg .name{fill:#555}
svg .attrs,svg .shape{fill:#6a737d;font-size:10px}
"""


def render_html(
    report: dict[str, Any],
    *,
    original: onnx.ModelProto | None = None,
    fused: onnx.ModelProto | None = None,
) -> str:
    """The report as an HTML page; region pictures when both models are given."""
    title = f"autofusion report: {report.get('model') or 'model'}"
    body = [
        f"<h1>{escape(title)}</h1>",
        _summary(report),
        _profile(report.get("profile")),
        _memory(report.get("memory")),
        _fusions(report),
        _fallback(report.get("fallback")),
        _rollbacks(report.get("rollbacks")),
        _rejected(report.get("rejected") or []),
        _check(report.get("check")),
        _near_misses(report.get("near_misses") or []),
        _left_alone(left_alone_records(report)),
        _regions(report, original, fused),
        _config(report.get("config")),
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)}</title><style>{_STYLE}</style></head><body>\n"
        + "\n".join(part for part in body if part)
        + "\n</body></html>\n"
    )


def _table(headers: list[str], rows: list[list[Any]], limit: int = _MAX_ROWS) -> str:
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    cells = [
        "<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows[:limit]
    ]
    more = f"<p>{len(rows) - limit} more rows in the JSON report.</p>" if len(rows) > limit else ""
    return f"<table><tr>{head}</tr>{''.join(cells)}</table>{more}"


def _cell(value: Any) -> str:
    if isinstance(value, Verdict):
        return value.html
    if isinstance(value, (list, tuple)):
        return "<br>".join(escape(str(v)) for v in value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return escape("" if value is None else str(value))


class Verdict:
    """A pass/fail cell, already rendered."""

    def __init__(self, passed: bool, text: str | None = None) -> None:
        label = text or ("passed" if passed else "FAILED")
        self.html = f'<span class="{"pass" if passed else "fail"}">{escape(label)}</span>'


def _summary(report: dict[str, Any]) -> str:
    nodes = report.get("nodes") or {}
    check = report.get("check")
    digests = report.get("digests") or {}
    tool = report.get("tool") or {}
    rows = [
        ["target", report.get("target")],
        ["output", report.get("output")],
        ["input sha256", digests.get("model_sha256")],
        ["output sha256", digests.get("output_sha256")],
        [
            "fusions",
            f"{sum((report.get('fusions') or {}).values())} in {report.get('rounds')} round(s)",
        ],
        ["nodes", f"{nodes.get('before')} -> {nodes.get('after')}"],
        ["size on disk", size_line(report)],
        ["peak memory", memory_line(report) or "not measured (not profiled)"],
        ["check", Verdict(False, "skipped") if check is None else Verdict(bool(check["passed"]))],
        ["registry version", report.get("registry_version")],
        ["report version", report.get("report_version")],
        ["tools", [f"{k} {v}" for k, v in tool.items()]],
    ]
    return '<h2 id="summary">Summary</h2>' + _table(["", ""], rows)


def _profile(profile: dict[str, Any] | None) -> str:
    if not isinstance(profile, dict):
        return ""
    parts = ['<h2 id="profile">Profile</h2>']
    latency = [c for c in profile.get("latency") or [] if isinstance(c, dict)]
    rows = [
        (f"{c.get('level')} {s.get('label')}", [_num(s, "median_ms"), _num(s, "p90_ms")])
        for c in latency
        for s in c.get("sessions") or []
        if isinstance(s, dict)
    ]
    if rows:
        parts.append("<h3>Latency per session</h3>")
        parts.append(grouped_bars("chart-latency", "latency", rows, ["median", "p90"], "ms"))
        ratios = [[c.get("level"), c.get("ratio")] for c in latency]
        parts.append(_table(["level", "fused / original (median)"], ratios))
    nodes = profile.get("nodes")
    times = {k: _op_times(nodes.get(k)) for k in ("original", "fused")} if nodes else {}
    if any(times.values()):
        parts.append("<h3>Time per op type</h3>" + _op_type_chart(times))
    return "".join(parts) if len(parts) > 1 else ""


def _memory(memory: dict[str, Any] | None) -> str:
    """Process peak, what stays resident, and onnxruntime's allocator peak, in bytes."""
    if not isinstance(memory, dict):
        return ""
    rows = [
        [label, *_bytes_pair(memory.get(f"{key}before_bytes"), memory.get(f"{key}after_bytes"))]
        for label, key in (
            ("process peak", ""),
            ("resident after the runs", "resident_"),
            ("onnxruntime allocator peak", "allocator_peak_"),
        )
    ]
    notes = [memory.get("measure"), memory.get("allocator_measure"), *memory.get("errors", [])]
    return (
        '<h2 id="memory">Memory</h2>'
        + _table(["", "original", "fused", "change"], rows)
        + "".join(f"<p>{escape(str(n))}</p>" for n in notes if n)
    )


def _bytes_pair(before: Any, after: Any) -> list[str | None]:
    shown = [bytes_text(v) if isinstance(v, int) else None for v in (before, after)]
    change = None
    if isinstance(before, int) and isinstance(after, int) and before:
        change = f"{(after - before) / before:+.1%}"
    return [*shown, change]


def _num(section: Any, key: str) -> float | None:
    value = section.get(key) if isinstance(section, dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def _op_times(node_profile: Any) -> dict[str, float]:
    """µs per run by op type, from one ``NodeProfile.to_dict()``."""
    if not isinstance(node_profile, dict):
        return {}
    runs = max(int(node_profile.get("runs") or 1), 1)
    op_types = [o for o in node_profile.get("op_types") or [] if isinstance(o, dict)]
    return {str(o.get("op_type")): (_num(o, "total_us") or 0.0) / runs for o in op_types}


def _op_type_chart(times: dict[str, dict[str, float]]) -> str:
    before, after = times.get("original") or {}, times.get("fused") or {}
    ops = sorted(set(before) | set(after), key=lambda op: -(before.get(op, 0) + after.get(op, 0)))
    rows = [(op, [before.get(op), after.get(op)]) for op in ops[:_MAX_OP_TYPES]]
    chart = grouped_bars(
        "chart-op-types", "time per op type", rows, ["original", "fused"], "µs/run"
    )
    left = len(ops) - _MAX_OP_TYPES
    return chart + (f"<p>{left} smaller op types left out.</p>" if left > 0 else "")


def _fusions(report: dict[str, Any]) -> str:
    counts = sorted((report.get("fusions") or {}).items(), key=lambda kv: (-kv[1], kv[0]))
    applied = report.get("applied") or []
    rows = [
        [
            f.get("index"),
            f.get("pattern"),
            f.get("round"),
            f.get("replaced_nodes"),
            f.get("new_ops"),
            (f.get("provenance") or {}).get("superseded_by"),
            _gain(f.get("predicted_gain")),
            _gain(f.get("measured_gain")),
        ]
        for f in applied
    ]
    headers = [
        "#",
        "pattern",
        "round",
        "replaced",
        "new ops",
        "superseded by",
        "predicted",
        "measured",
    ]
    return (
        '<h2 id="fusions">Fusions</h2>'
        + _table(["pattern", "count"], [list(kv) for kv in counts])
        + "<h3>Applied</h3>"
        + _table(headers, rows)
    )


def _gain(gain: Any) -> str | None:
    if isinstance(gain, dict) and gain.get("before_us") is not None:
        return f"{_us(gain.get('before_us'))} -> {_us(gain.get('after_us'))} µs/run"
    if isinstance(gain, dict) and gain.get("estimated_from") in ("hints", "none"):
        return f"saves {_us(gain.get('saved_us'))} µs/run ({gain['estimated_from']})"
    return None if gain is None else json.dumps(gain)


def _us(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "n/a"


def _rollbacks(rollbacks: list[dict[str, Any]] | None) -> str:
    if not rollbacks:
        return ""
    rows = [[r.get("stage"), r.get("pattern"), r.get("nodes"), r.get("error")] for r in rollbacks]
    headers = ["stage", "pattern", "nodes", "error"]
    return '<h2 id="rollbacks">Rolled back</h2>' + _table(headers, rows)


def _fallback(fallback: dict[str, Any] | None) -> str:
    if not fallback:
        return ""
    if fallback.get("unchanged"):
        kept = "no set of fusions passed, so the model is written as it came"
    else:
        kept = f"{fallback.get('kept')} of the fusions passed and are kept"
    dropped = fallback.get("dropped") or []
    rows = [[r.get("pattern"), r.get("nodes"), r.get("error")] for r in dropped]
    table = _table(["pattern", "nodes", "error"], rows) if rows else ""
    return (
        '<h2 id="fallback">Fell back after a failed check</h2>'
        f"<p>{escape(str(fallback.get('reason')))}: {escape(kept)}.</p>{table}"
    )


def _rejected(records: list[dict[str, Any]]) -> str:
    if not records:
        return ""
    rows = [[r.get("step"), r.get("name"), r.get("nodes"), r.get("failed")] for r in records]
    return (
        '<h2 id="rejected">Taken back as bugs of autofusion</h2>'
        "<p>The run went on without these steps; please report them with the model.</p>"
        + _table(["step", "name", "nodes", "what failed"], rows)
    )


def _check(check: dict[str, Any] | None) -> str:
    if check is None:
        return '<h2 id="check">Validation</h2><p>Skipped.</p>'
    verdict = Verdict(bool(check.get("passed"))).html
    head = (
        f'<h2 id="check">Validation</h2><p>{verdict} on {escape(str(check.get("samples")))} '
        f"sample(s), seed {escape(str(check.get('seed')))}</p>"
    )
    if check.get("error"):
        head += f"<p class=fail>{escape(str(check['error']))}</p>"
    rows = [
        [
            o.get("name"),
            Verdict(bool(o.get("passed"))),
            o.get("max_abs_diff"),
            o.get("max_rel_diff"),
            o.get("rtol"),
            o.get("atol"),
            o.get("detail"),
        ]
        for o in check.get("outputs") or []
    ]
    headers = ["output", "verdict", "max abs", "max rel", "rtol", "atol", "detail"]
    return head + _table(headers, rows)


def _left_alone(records: list[dict[str, Any]]) -> str:
    if not records:
        return ""
    rows = [[r.get("what"), r.get("nodes"), r.get("reason")] for r in records]
    return '<h2 id="left-alone">Left as it is</h2>' + _table(["part", "nodes", "why"], rows)


def _near_misses(misses: list[dict[str, Any]]) -> str:
    if not misses:
        return ""
    rows = [[m.get("pattern"), m.get("nodes"), m.get("kind"), m.get("reason")] for m in misses]
    headers = ["pattern", "nodes", "kind", "reason"]
    return '<h2 id="near-misses">Near misses</h2>' + _table(headers, rows)


def _regions(
    report: dict[str, Any], original: onnx.ModelProto | None, fused: onnx.ModelProto | None
) -> str:
    """A few examples of each pattern (``example_fusions``), with the count of the rest."""
    applied = report.get("applied") or []
    if original is None or fused is None or not applied:
        return ""
    before, after = GraphIndex(with_shapes(original)), GraphIndex(with_shapes(fused))
    examples = example_fusions(applied)
    parts = [f'<h2 id="regions">Fused regions ({len(applied)})</h2>']
    counts: dict[str, int] = {}
    for fusion in applied:
        counts[str(fusion.get("pattern"))] = counts.get(str(fusion.get("pattern")), 0) + 1
    shown: dict[str, int] = {}
    for fusion in examples:
        pattern = str(fusion.get("pattern"))
        if pattern not in shown:
            parts.append(f"<h3>{escape(pattern)}: {counts[pattern]} fusion(s)</h3>")
        shown[pattern] = shown.get(pattern, 0) + 1
        parts.append(_region(fusion, applied, before, after))
    left = len(applied) - len(examples)
    if left:
        rest = ", ".join(
            f"{escape(p)} {n - shown.get(p, 0)}" for p, n in counts.items() if n > shown.get(p, 0)
        )
        parts.append(
            f"<p>{left} more regions not drawn ({rest}): the Applied table lists them.</p>"
        )
    return "".join(parts)


def _region(
    fusion: dict[str, Any], applied: list[dict[str, Any]], before: GraphIndex, after: GraphIndex
) -> str:
    index = fusion.get("index", applied.index(fusion))
    original_nodes = (fusion.get("provenance") or {}).get("original_nodes") or fusion.get(
        "replaced_nodes", []
    )
    label = f"#{index} {fusion.get('pattern')}"
    left = region_svg(before, original_nodes, f"{label}: before")
    right = region_svg(after, final_nodes(applied, index), f"{label}: after")
    missing = "<p>not found in this model</p>"
    return (
        f"<h4>{escape(label)}</h4><div class=pair><div><h4>before</h4>{left or missing}</div>"
        f"<div><h4>after</h4>{right or missing}</div></div>"
    )


def _config(config: dict[str, Any] | None) -> str:
    if config is None:
        return ""
    return f'<h2 id="config">Config</h2><pre>{escape(json.dumps(config, indent=2))}</pre>'
