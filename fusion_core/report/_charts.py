"""Bar charts as inline SVG (no scripts, no external files): labels are escaped."""

from __future__ import annotations

from collections.abc import Sequence
from html import escape

__all__ = ["grouped_bars"]

_LABEL_W = 200
_BAR_W = 420
_BAR_H = 12
_GAP = 10
_COLORS = ("#8c96a8", "#2f7ed8", "#f28f43", "#2a9d8f")


def grouped_bars(
    chart_id: str,
    title: str,
    rows: Sequence[tuple[str, Sequence[float | None]]],
    series: Sequence[str],
    unit: str,
) -> str:
    """Horizontal bars, one group per row and one bar per series, scaled to the largest."""
    peak = max((v for _, values in rows for v in values if v), default=0.0) or 1.0
    group_h = len(series) * _BAR_H + _GAP
    legend_h = 24
    height = legend_h + len(rows) * group_h + 8
    width = _LABEL_W + _BAR_W + 110
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" id="{escape(chart_id)}" class="chart" '
        f'width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img">',
        f"<title>{escape(title)}</title>",
    ]
    for k, name in enumerate(series):
        x = _LABEL_W + k * 120
        parts.append(
            f'<rect x="{x}" y="4" width="12" height="12" fill="{_COLORS[k % len(_COLORS)]}"/>'
            f'<text x="{x + 16}" y="14">{escape(name)}</text>'
        )
    for i, (label, values) in enumerate(rows):
        top = legend_h + i * group_h
        parts.append(
            f'<text x="{_LABEL_W - 6}" y="{top + len(series) * _BAR_H / 2 + 4:.1f}" '
            f'text-anchor="end">{escape(_short(label))}<title>{escape(label)}</title></text>'
        )
        for k, value in enumerate(values):
            parts.append(_bar(top + k * _BAR_H, value, peak, unit, _COLORS[k % len(_COLORS)]))
    parts.append("</svg>")
    return "".join(parts)


def _bar(y: float, value: float | None, peak: float, unit: str, color: str) -> str:
    if value is None:
        return f'<text x="{_LABEL_W + 2}" y="{y + _BAR_H - 2}">n/a</text>'
    length = max(value / peak * _BAR_W, 0.5)
    return (
        f'<rect x="{_LABEL_W}" y="{y}" width="{length:.1f}" height="{_BAR_H - 2}" '
        f'fill="{color}"/><text x="{_LABEL_W + length + 4:.1f}" y="{y + _BAR_H - 2}">'
        f"{value:,.3g} {escape(unit)}</text>"
    )


def _short(label: str, limit: int = 30) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "…"
