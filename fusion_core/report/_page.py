"""The report as one self-contained HTML page, from the templates the dashboard's job
page includes too (``templates/_report.html``): one view (``report_view``), one verdict.

The page has no scripts and nothing fetched: its styles are inline and its charts and
region pictures inline SVG, so it is served inline under ``default-src 'none';
style-src 'unsafe-inline'; img-src data:`` and ``sandbox``. Autoescaping is on: every
string from the report or the models renders as text; only the SVG this package drew
(which escapes every label) is marked safe.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from jinja2 import Environment, FileSystemLoader, select_autoescape

from autofusion.fusion_core.report._region_data import region_pictures, regions_from_data
from autofusion.fusion_core.report._view import report_view

if TYPE_CHECKING:  # the dashboard imports REPORT_TEMPLATES and loads no onnx
    import onnx

__all__ = ["REPORT_STYLESHEET", "REPORT_TEMPLATES", "render_html"]

# The folder of the report's templates; the dashboard adds it to its loader.
REPORT_TEMPLATES = Path(__file__).resolve().parent / "templates"
# The one sheet of the report's styles: inlined in report.html, linked by the dashboard.
REPORT_STYLESHEET = REPORT_TEMPLATES / "report.css"


@cache
def _environment() -> Environment:
    loader = FileSystemLoader(REPORT_TEMPLATES)
    return Environment(loader=loader, autoescape=select_autoescape(default=True))


def _run(report: dict[str, Any]) -> dict[str, Any]:
    """What only the standalone page shows: files, digests, versions, the config."""
    digests = report.get("digests") if isinstance(report.get("digests"), dict) else {}
    tools = report.get("tool") if isinstance(report.get("tool"), dict) else {}
    config = report.get("config")
    return {
        "output": report.get("output"),
        "model_sha256": digests.get("model_sha256"),
        "output_sha256": digests.get("output_sha256"),
        "rounds": report.get("rounds"),
        "registry_version": report.get("registry_version"),
        "report_version": report.get("report_version"),
        "tools": sorted(tools.items()),
        "config": json.dumps(config, indent=2) if config is not None else None,
    }


def render_html(
    report: dict[str, Any],
    *,
    original: onnx.ModelProto | None = None,
    fused: onnx.ModelProto | None = None,
    pictures: dict[str, Any] | None = None,
) -> str:
    """The report as an HTML page; region pictures when both models are given, or
    ``pictures`` (``region_pictures``, what regions.json holds) drawn already."""
    applied = [f for f in report.get("applied") or [] if isinstance(f, dict)]
    if pictures is None and original is not None and fused is not None and applied:
        pictures = region_pictures(applied, original, fused)
    regions = regions_from_data(pictures) if pictures is not None and applied else None
    view = report_view(report, regions=regions)
    template = _environment().get_template("report.html")
    return template.render(report=view, run=_run(report), standalone=True) + "\n"
