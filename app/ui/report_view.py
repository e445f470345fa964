"""The job report as the job page shows it: ``fusion_core.report.report_view``, the view
report.html renders too (one renderer, one verdict: issue 27). The names stay here for
the dashboard's modules that import them."""

from __future__ import annotations

from autofusion.fusion_core.report import (
    DASH,
    MAX_MATCH_PICTURES,
    fmt,
    fmt_bytes,
    report_view,
    speed_class,
)

__all__ = ["DASH", "MAX_MATCH_PICTURES", "fmt", "fmt_bytes", "report_view", "speed_class"]
