"""Reports: the JSON document (the contract) and its renderings.

``build_report`` makes the document, valid against ``report_schema()`` (published as
``docs/report.schema.json``); ``format_summary`` (terminal), ``format_markdown`` (CI)
and ``render_html`` (one self-contained page) render it, all stating the one speed
verdict of ``speed_verdict``. ``report_view`` and the templates in ``REPORT_TEMPLATES``
are what report.html and the dashboard's job page both render, in the styles of the one
sheet ``REPORT_STYLESHEET`` (inlined in report.html, linked by the dashboard).
``read_report`` is the one typed reader every consumer (worker, dashboard, CI client)
takes its facts from.

The names load on first use (``lazy_loader``): ``read_report`` needs none of the
renderings, so a client that only reads a report imports no onnx.
"""

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach(
    __name__,
    submod_attrs={
        "_charts": ["grouped_bars", "histogram", "timeline"],
        "_folding": ["FOLDING_PART", "left_alone_records", "unfolded_text"],
        "_graph": ["GraphIndex", "region_svg"],
        "_growth": ["GROWTH_FLOORS", "GROWTH_LIMITS", "Growth", "growth"],
        "_page": ["REPORT_STYLESHEET", "REPORT_TEMPLATES", "render_html"],
        "_json": ["REPORT_VERSION", "build_report", "file_sha256"],
        "_markdown": ["format_markdown"],
        "_provenance": ["final_nodes"],
        "_reader": ["DEPLOYMENT_LEVEL", "ReportSummary", "Speed", "read_report", "speed_section"],
        "_region_data": [
            "EXAMPLES_PER_PATTERN",
            "MAX_REGION_PICTURES",
            "example_fusions",
            "region_pictures",
            "regions_from_data",
        ],
        "_schema": ["report_schema"],
        "_text": ["fallback_line", "format_summary"],
        "_units": [
            "bytes_text",
            "change_of",
            "change_words",
            "duration_text",
            "percent_text",
            "saved_text",
        ],
        "_verdict": ["MEDIANS_NOTE", "PAIRED_WHY", "SpeedVerdict", "speed_verdict"],
        "_view": ["DASH", "MAX_MATCH_PICTURES", "fmt", "fmt_bytes", "report_view", "speed_class"],
        "_view_groups": ["EXAMPLES_SHOWN", "OPEN_GROUPS", "reason_template"],
    },
)
