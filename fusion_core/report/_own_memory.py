"""The report's ``optimize_memory``, worded once for the terminal, report.md and the page.

``optimize_memory`` is the optimizing process's own peak memory (not the fused model's
session: that is ``memory``), by phase, against the model's bytes on disk and the peak
predicted before the run (fusion_core/pipeline/memory.py). No onnx here: the dashboard
words a report without it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autofusion.fusion_core.report._units import bytes_text

__all__ = ["optimize_memory_line", "optimize_memory_phases"]


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _record(report: Mapping[str, Any]) -> Mapping[str, Any]:
    record = report.get("optimize_memory")
    return record if isinstance(record, Mapping) else {}


def optimize_memory_line(report: Mapping[str, Any]) -> str | None:
    """``peak 1.90 GiB, 4.1x the model (464.0 MiB with its data); predicted 2.20 GiB``;
    None when the report has no peak (an older report, or a platform without one)."""
    record = _record(report)
    peak, model = _int(record.get("peak_rss_bytes")), _int(record.get("model_bytes"))
    if peak is None:
        return None
    text = f"peak {bytes_text(peak)}"
    if model:
        text += f", {peak / model:.1f}x the model ({bytes_text(model)} with its data)"
    predicted = _int(record.get("predicted_peak_bytes"))
    if predicted is not None:
        text += f"; predicted {bytes_text(predicted)}"
    return text


def optimize_memory_phases(report: Mapping[str, Any]) -> list[dict[str, str]]:
    """Per phase: the peak up to its end, what it added to the peak, and what was
    resident at its end, as text (the page's table)."""
    by_phase = _record(report).get("by_phase")
    rows, before = [], _int(_record(report).get("before_bytes"))
    for name, entry in by_phase.items() if isinstance(by_phase, Mapping) else ():
        entry = entry if isinstance(entry, Mapping) else {}
        peak, resident = _int(entry.get("peak_rss_bytes")), _int(entry.get("rss_bytes"))
        raised = peak - before if peak is not None and before is not None else None
        rows.append(
            {
                "phase": str(name),
                "peak": bytes_text(peak) if peak is not None else "—",
                "raised": bytes_text(max(0, raised)) if raised is not None else "—",
                "resident": bytes_text(resident) if resident is not None else "—",
            }
        )
        if peak is not None:
            before = max(peak, before or 0)
    return rows
