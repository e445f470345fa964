"""What the fused model costs besides run time: file size, peak memory, cold start.

Fusion can grow a model (a folded constant, a duplicated weight: issue 27 saw 78 kB
become 97 MB) or its peak memory (+28%). Such growth is flagged when the speed did not
pay for it: the verdict is not "faster" (or speed was not measured). A faster model that
grew says so without the flag: whether that trade is worth it is the user's call.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autofusion.fusion_core.report._reader import read_report
from autofusion.fusion_core.report._units import bytes_text, change_of, change_words, duration_text

__all__ = ["GROWTH_FLOORS", "GROWTH_LIMITS", "Growth", "growth"]

# Growth below these is noise or not worth a word: a timer's jitter moves a session's
# creation time more than an allocator moves the peak, hence the wider cold-start limit.
GROWTH_LIMITS = {"file-size": 0.10, "peak-memory": 0.10, "cold-start": 0.25}
# ... and growth must be this large too: a 1.3 KiB model that gains 130 bytes, or a
# session created 2 ms later, costs nobody anything (bytes; ms for the cold start).
GROWTH_FLOORS = {"file-size": 64 << 10, "peak-memory": 1 << 20, "cold-start": 5.0}


@dataclass(frozen=True)
class Growth:
    """One cost before -> after, in human units."""

    key: str  # file-size, peak-memory, cold-start (the page's ids)
    what: str
    before: str
    after: str
    change: str | None  # ``+28%``, ``1243x larger``; None without a before
    flagged: bool  # grew past its limit while the speed did not pay for it
    note: str | None  # why it is flagged, or that the speedup may pay for it


def _one(key: str, what: str, pair: tuple[Any, Any], text, faster: bool, said: str) -> Growth:
    """``said``: the speed verdict in words, for the note of a flag."""
    before, after = pair
    limit = max(before * GROWTH_LIMITS[key], GROWTH_FLOORS[key])
    grew = bool(before) and after - before > limit
    flagged = grew and not faster
    note = None
    if flagged:
        note = f"{what} grew while the speed did not pay for it ({said})"
    elif grew:
        note = f"{what} grew; the speedup may pay for it"
    return Growth(key, what, text(before), text(after), change_of(before, after), flagged, note)


def _cold_start(report: Mapping[str, Any], level: str | None) -> tuple[float, float] | None:
    """Each model's session creation time (ms) at ``level``; None unmeasured."""
    profile = report.get("profile") if isinstance(report.get("profile"), Mapping) else {}
    for comparison in profile.get("latency") or []:
        if isinstance(comparison, Mapping) and comparison.get("level") == level:
            sessions = {
                s.get("label"): s.get("create_ms")
                for s in comparison.get("sessions") or []
                if isinstance(s, Mapping)
            }
            pair = sessions.get("original"), sessions.get("fused")
            if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in pair):
                return float(pair[0]), float(pair[1])
    return None


def growth(report: Mapping[str, Any]) -> list[Growth]:
    """Size, peak memory and cold start where the report measured both models."""
    summary = read_report(report)
    speed = summary.speed
    faster = speed is not None and speed.verdict == "faster"
    said = "not measured" if speed is None else change_words(speed.ratio, speed.verdict)
    rows = []
    pairs = (
        ("file-size", "file size", (summary.size_before_bytes, summary.size_after_bytes)),
        (
            "peak-memory",
            "peak memory",
            (summary.peak_memory_before_bytes, summary.peak_memory_after_bytes),
        ),
    )
    for key, what, pair in pairs:
        if pair[0] is not None and pair[1] is not None:
            rows.append(_one(key, what, pair, bytes_text, faster, said))
    cold = _cold_start(report, speed.level if speed else None)
    if cold is not None:
        rows.append(_one("cold-start", "cold start", cold, duration_text, faster, said))
    return rows
