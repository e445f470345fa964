"""Charts as inline SVG (no scripts, no external files): every label is escaped.

- ``grouped_bars``: horizontal bars, one group per row and one bar per series;
- ``histogram``: columns of counts on a log scale (an error histogram's tail is a few
  elements among millions), the columns from a given bin on marked;
- ``timeline``: one bar cut into consecutive segments (where a job's time went).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape

__all__ = ["grouped_bars", "histogram", "timeline"]

_LABEL_W = 200
_BAR_W = 420
_BAR_H = 12
_GAP = 10
_COLORS = ("#8c96a8", "#2f7ed8", "#f28f43", "#2a9d8f")
_SEGMENT_COLORS = ("#8c96a8", "#2f7ed8", "#f28f43", "#2a9d8f", "#9b59b6", "#e9c46a", "#e76f51")


def _open(chart_id: str, title: str, width: float, height: float, css: str = "chart") -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="{css}" '
        f'width="{width:.0f}" height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" '
        f'role="img"><title>{escape(title)}</title>'
    )


def grouped_bars(
    chart_id: str,
    title: str,
    rows: Sequence[tuple[str, Sequence[float | None]]],
    series: Sequence[str],
    unit: str,
    *,
    label_width: int = _LABEL_W,
    bar_width: int = _BAR_W,
) -> str:
    """Horizontal bars, one group per row and one bar per series, scaled to the largest."""
    peak = max((v for _, values in rows for v in values if v), default=0.0) or 1.0
    group_h = len(series) * _BAR_H + _GAP
    legend_h = 24
    height = legend_h + len(rows) * group_h + 8
    width = label_width + bar_width + 110
    parts = [_open(chart_id, title, width, height)]
    for k, name in enumerate(series):
        x = label_width + k * 120
        parts.append(
            f'<rect x="{x}" y="4" width="12" height="12" fill="{_COLORS[k % len(_COLORS)]}"/>'
            f'<text x="{x + 16}" y="14">{escape(name)}</text>'
        )
    limit = max(label_width // 6 - 3, 8)
    for i, (label, values) in enumerate(rows):
        top = legend_h + i * group_h
        parts.append(
            f'<text x="{label_width - 6}" y="{top + len(series) * _BAR_H / 2 + 4:.1f}" '
            f'text-anchor="end">{escape(_short(label, limit))}<title>{escape(label)}</title></text>'
        )
        for k, value in enumerate(values):
            color = _COLORS[k % len(_COLORS)]
            parts.append(_bar(top + k * _BAR_H, value, peak, unit, color, label_width, bar_width))
    parts.append("</svg>")
    return "".join(parts)


def _bar(
    y: float, value: float | None, peak: float, unit: str, color: str, left: int, span: int
) -> str:
    if value is None:
        return f'<text x="{left + 2}" y="{y + _BAR_H - 2}">n/a</text>'
    length = max(value / peak * span, 0.5)
    return (
        f'<rect x="{left}" y="{y}" width="{length:.1f}" height="{_BAR_H - 2}" '
        f'fill="{color}"/><text x="{left + length + 4:.1f}" y="{y + _BAR_H - 2}">'
        f"{value:,.3g} {escape(unit)}</text>"
    )


def histogram(
    chart_id: str,
    title: str,
    bins: Sequence[tuple[str, int]],
    *,
    marked_from: int | None = None,
    marked_label: str = "",
) -> str:
    """Columns of counts, heights on a log scale (log10(1 + count)); the columns from
    ``marked_from`` on are drawn in the warning colour, ``marked_label`` in the legend."""
    col_w, gap, plot_h, top, bottom = 44, 6, 110, 40, 22
    width = 10 + len(bins) * (col_w + gap)
    height = top + plot_h + bottom
    peak = max((math.log10(1 + max(c, 0)) for _, c in bins), default=0.0) or 1.0
    parts = [_open(chart_id, title, width, height)]
    if marked_from is not None and marked_label:
        parts.append(
            f'<rect x="10" y="6" width="12" height="12" fill="#cf222e"/>'
            f'<text x="26" y="16">{escape(marked_label)}</text>'
        )
    baseline = top + plot_h
    for k, (label, count) in enumerate(bins):
        x = 10 + k * (col_w + gap)
        h = math.log10(1 + max(count, 0)) / peak * plot_h
        marked = marked_from is not None and k >= marked_from
        fill = "#cf222e" if marked and count else "#2f7ed8"
        parts.append(
            f'<g class="bin" data-count="{count}"><title>{escape(label)}: {count:,}</title>'
            f'<rect x="{x}" y="{baseline - h:.1f}" width="{col_w}" height="{max(h, 0.5):.1f}" '
            f'fill="{fill}"/>'
            f'<text x="{x + col_w / 2}" y="{baseline - h - 3:.1f}" text-anchor="middle">'
            f"{_count(count)}</text>"
            f'<text x="{x + col_w / 2}" y="{baseline + 14}" text-anchor="middle">'
            f"{escape(label)}</text></g>"
        )
    parts.append(
        f'<line x1="8" y1="{baseline}" x2="{width - 2}" y2="{baseline}" stroke="#888"/></svg>'
    )
    return "".join(parts)


def _count(count: int) -> str:
    if count >= 1_000_000:
        return f"{count / 1_000_000:.3g}M"
    if count >= 10_000:
        return f"{count / 1000:.3g}k"
    return str(count)


def timeline(
    chart_id: str, title: str, segments: Sequence[tuple[str, float]], *, width: int = 720
) -> str:
    """One bar, ``segments`` (label, seconds) side by side in proportion; a segment wide
    enough carries its label, every one its label and time as a tooltip."""
    total = sum(max(s, 0.0) for _, s in segments) or 1.0
    bar_h = 20
    parts = [_open(chart_id, title, width, bar_h, "chart timeline")]
    x = 0.0
    for k, (label, seconds) in enumerate(segments):
        color = _SEGMENT_COLORS[k % len(_SEGMENT_COLORS)]
        span = max(seconds, 0.0) / total * width
        text = f"{label} {seconds:.1f} s"
        parts.append(
            f'<g class="segment"><title>{escape(text)}</title>'
            f'<rect x="{x:.1f}" y="0" width="{max(span, 0.5):.1f}" height="{bar_h}" '
            f'fill="{color}"/>'
        )
        if span >= 7 * len(text):  # about 7 px a character at 11 px
            parts.append(f'<text x="{x + 4:.1f}" y="14" fill="#fff">{escape(text)}</text>')
        parts.append("</g>")
        x += span
    parts.append("</svg>")
    return "".join(parts)


def _short(label: str, limit: int = 30) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"
