"""The one speed verdict every rendering states: report.md, report.html, the terminal
summary, the CI client and the job page.

The verdict is the paired ratio at the deployment level (``read_report(report).speed``):
fused / original run time per interleaved iteration, its median and interval. Each
model's own median run time is shown beside it only as detail, with why the two can
disagree. Issue 27 found report.html printing the ratio of those medians (1.136, "slower")
while report.md and the page said 1.006, "no measurable change": every rendering now
words the speed through ``speed_verdict`` (and ``Speed.describe``, its one line).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autofusion.fusion_core.report._reader import Speed, read_report
from autofusion.fusion_core.report._units import change_words, duration_text

__all__ = [
    "MEDIANS_NOTE",
    "PAIRED_WHY",
    "SpeedVerdict",
    "speed_verdict",
]

# Why each model's median can say something else than the paired ratio, in plain words.
MEDIANS_NOTE = (
    "Each model's median is taken over its own runs, so a slow stretch of the machine "
    "that hit some iterations can move one median more than the other. The verdict pairs "
    "the two models iteration by iteration, where that noise cancels, and its interval "
    "says how sure the measurement is."
)
# The same in a few words, for one line of a log.
PAIRED_WHY = "the verdict pairs the two models run by run, where the machine's noise cancels"
_CSS = {"faster": "speed-faster", "slower": "speed-slower"}


@dataclass(frozen=True)
class SpeedVerdict:
    """The paired verdict with each model's median run time at the same level."""

    speed: Speed
    original_ms: float | None = None  # each model's median run, measured apart
    fused_ms: float | None = None

    @property
    def verdict(self) -> str:
        return self.speed.verdict or "no verdict (an older report)"

    @property
    def headline(self) -> str:
        return change_words(self.speed.ratio, self.speed.verdict)

    @property
    def css(self) -> str:
        """speed-faster, speed-slower or speed-no-change (also an older report's)."""
        return _CSS.get(self.speed.verdict or "", "speed-no-change")

    @property
    def interval(self) -> str | None:
        """``95% 0.960–1.030``; None in a report older than the interval."""
        if self.speed.low is None or self.speed.high is None:
            return None
        share = f"{self.speed.confidence:.0%} " if self.speed.confidence else ""
        return f"{share}{self.speed.low:.3f}–{self.speed.high:.3f}"

    @property
    def time_change(self) -> str | None:
        """What the verdict means per run on the original's median: ``saves 10.4 ms/run``,
        ``costs 1.6 ms/run``; None when nothing measurable changed."""
        if self.original_ms is None or self.speed.verdict not in ("faster", "slower"):
            return None
        change = self.original_ms * (1.0 - self.speed.ratio)
        word = "saves" if change > 0 else "costs"
        return f"{word} {duration_text(abs(change))}/run"

    @property
    def medians(self) -> str | None:
        """``original 48.8 ms, fused 55.5 ms``; None without both."""
        if self.original_ms is None or self.fused_ms is None:
            return None
        return f"original {duration_text(self.original_ms)}, fused {duration_text(self.fused_ms)}"

    @property
    def medians_differ(self) -> str | None:
        """What the medians alone would say where it is not the verdict (their ratio
        outside the paired interval): ``the medians alone say +14% slower``."""
        if not self.original_ms or self.fused_ms is None:
            return None
        ratio = self.fused_ms / self.original_ms
        low, high = self.speed.low, self.speed.high
        if low is not None and high is not None:
            agree = low <= ratio <= high
        else:  # an older report: no interval to hold the medians' ratio against
            agree = (ratio < 1.0) == (self.speed.ratio < 1.0)
        return None if agree else f"the medians alone say {change_words(ratio, None)}"

    def line(self) -> str:
        return self.speed.describe()


def speed_verdict(report: Mapping[str, Any]) -> SpeedVerdict | None:
    """The report's speed verdict with the medians at its level; None when unmeasured."""
    speed = read_report(report).speed
    if speed is None:
        return None
    profile = report.get("profile") if isinstance(report.get("profile"), Mapping) else {}
    medians: dict[str, float] = {}
    for level in profile.get("latency") or []:
        if isinstance(level, Mapping) and level.get("level") == speed.level:
            for session in level.get("sessions") or []:
                value = session.get("median_ms") if isinstance(session, Mapping) else None
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    medians[str(session.get("label"))] = float(value)
    return SpeedVerdict(speed, medians.get("original"), medians.get("fused"))
