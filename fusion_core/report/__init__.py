"""Reports: the JSON document (the contract) and its renderings."""

from fusion_core.report._json import REPORT_VERSION, build_report
from fusion_core.report._text import format_summary

__all__ = ["REPORT_VERSION", "build_report", "format_summary"]
