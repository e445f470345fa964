"""Reports: the JSON document (the contract) and its renderings.

``build_report`` makes the document, valid against ``report_schema()`` (published as
``docs/report.schema.json``); ``format_summary`` (terminal), ``format_markdown`` (CI)
and ``render_html`` (one self-contained page) render it. ``read_report`` is the one
typed reader every consumer (worker, dashboard, CI client) takes its facts from.

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
        "_html": ["render_html"],
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
    },
)
