"""Units the renderings and the dashboard share, with no dependency: the dashboard
words a report without importing onnx-ir or onnx (tests/app/test_api_imports.py).

Every number a person reads goes through here, so the terminal, report.md, report.html
and the job page say ``12.4 ms`` and ``lost 1.6 ms/run`` alike (issue 27 found the page
printing ``1.26e+05 µs/run`` and ``saved µs/run -1581``).
"""

from __future__ import annotations

__all__ = [
    "bytes_text",
    "change_of",
    "change_words",
    "duration_text",
    "percent_text",
    "saved_text",
]


def bytes_text(value: int) -> str:
    """Bytes in binary units: ``812 B``, ``3.4 KiB``, ``98.4 MiB``, ``1.20 GiB``."""
    if value < 1024:
        return f"{value} B"
    for unit, scale in (("KiB", 1 << 10), ("MiB", 1 << 20)):
        if value < scale * 1024:
            return f"{value / scale:.1f} {unit}"
    return f"{value / (1 << 30):.2f} GiB"


def _three(value: float) -> str:
    """Three significant digits, never an exponent (999.7 reads ``1000``, not ``1e+03``)."""
    text = f"{value:.3g}"
    return f"{value:.0f}" if "e" in text else text


def duration_text(ms: float) -> str:
    """A time in the unit that reads: ``812 µs``, ``12.4 ms``, ``126 ms``, ``1.26 s``."""
    size = abs(ms)
    if size < 1:
        return f"{_three(ms * 1000)} µs"
    if size < 1000:
        return f"{_three(ms)} ms"
    return f"{_three(ms / 1000)} s"


def saved_text(saved_us: float) -> str:
    """Time per run a change saved, a loss as a loss: ``saved 40 µs/run``, ``lost 1.58
    ms/run`` (never ``saved -1581``)."""
    if saved_us == 0:
        return "no change per run"
    word = "saved" if saved_us > 0 else "lost"
    return f"{word} {duration_text(abs(saved_us) / 1000)}/run"


def percent_text(fraction: float) -> str:
    """A change as a signed percentage: ``+12%``, ``-3.5%`` (one decimal below 10%)."""
    if abs(fraction) >= 0.095:
        return f"{fraction:+.0%}"
    return f"{fraction:+.1%}"


def change_of(before: float, after: float) -> str | None:
    """``before`` -> ``after`` as a change: ``+28%``, ``-3.5%``, or ``1243x larger`` past
    double (a percentage of 124200% reads as noise); None without a before."""
    if not before:
        return None
    if after >= 2 * before:
        return f"{_three(after / before)}x larger"
    return percent_text((after - before) / before)


def change_words(ratio: float, verdict: str | None) -> str:
    """The verdict as a person says it: ``19% faster``, ``+25% slower``, ``no measurable
    change``; a report without a verdict (older) gives the bare change."""
    if verdict == "no measurable change":
        return verdict
    change = ratio - 1.0
    if verdict == "faster" or (verdict is None and change < 0):
        return f"{percent_text(-change).lstrip('+')} faster"
    return f"{percent_text(change)} slower"
