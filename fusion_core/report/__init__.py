"""Reports: the JSON document (the contract) and its renderings.

``build_report`` makes the document, valid against ``report_schema()`` (published as
``docs/report.schema.json``); ``format_summary`` (terminal), ``format_markdown`` (CI)
and ``render_html`` (one self-contained page) render it. ``read_report`` is the one
typed reader every consumer (worker, dashboard, CI client) takes its facts from.
"""

from fusion_core.report._charts import grouped_bars
from fusion_core.report._graph import GraphIndex, region_svg
from fusion_core.report._html import MAX_REGION_PICTURES, render_html
from fusion_core.report._json import REPORT_VERSION, build_report, file_sha256
from fusion_core.report._markdown import format_markdown
from fusion_core.report._provenance import final_nodes
from fusion_core.report._reader import (
    DEPLOYMENT_LEVEL,
    ReportSummary,
    Speed,
    read_report,
    speed_section,
)
from fusion_core.report._region_data import region_pictures, regions_from_data
from fusion_core.report._schema import report_schema
from fusion_core.report._text import format_summary

__all__ = [
    "region_pictures",
    "regions_from_data",
    "DEPLOYMENT_LEVEL",
    "MAX_REGION_PICTURES",
    "REPORT_VERSION",
    "GraphIndex",
    "ReportSummary",
    "Speed",
    "build_report",
    "file_sha256",
    "final_nodes",
    "format_markdown",
    "format_summary",
    "grouped_bars",
    "read_report",
    "region_svg",
    "render_html",
    "report_schema",
    "speed_section",
]
