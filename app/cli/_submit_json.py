"""``autofusion submit --json``: the facts first, a few kilobytes, then details; and the
pieces the text and Markdown summaries share with it (``urls``, ``speed_dict``).

A CI script reads the first keys (``status``, ``verdict``, ``speedup``, ``fusions``,
``gate``, ``job_id``, ``urls``) and stops; ``details`` holds the rest of what the summary
shows. The whole report and job resource (often hundreds of kilobytes) come only with
``--json-full``, or from ``urls.report`` and ``urls.job``. docs/service.md, "submit
--json", documents every field.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from autofusion.fusion_core.report import ReportSummary, Speed, read_report

__all__ = ["speed_dict", "submit_document", "urls"]


def speed_dict(speed: Speed | None) -> dict[str, Any] | None:
    """The speed as JSON: the reader's fields and the speedup (original / fused)."""
    if speed is None:
        return None
    speedup = speed.speedup if math.isfinite(speed.speedup) else None
    return {**asdict(speed), "speedup": speedup}


def urls(outcome: Any) -> dict[str, str]:
    """Where to look: the job (API), its dashboard page, and its report once it has one."""
    job = outcome.job
    links = job.get("links") if isinstance(job.get("links"), dict) else {}

    def absolute(path: str) -> str:
        return path if path.startswith(("http://", "https://")) else outcome.server + path

    found = {"job": outcome.url, "page": f"{outcome.server}/ui/jobs/{job.get('id')}"}
    if isinstance(links.get("report"), str):
        found["report"] = absolute(links["report"])
    artifacts = links.get("artifacts") if isinstance(links.get("artifacts"), dict) else {}
    html = artifacts.get("report.html")
    if isinstance(html, str):
        found["report_html"] = absolute(html)  # the download (an attachment)
        # The page that opens in the browser: the dashboard's, inline and sandboxed.
        found["report_page"] = f"{outcome.server}/ui/jobs/{job.get('id')}/report.html"
    if job.get("status") == "succeeded" and isinstance(links.get("model"), str):
        found["model"] = absolute(links["model"])  # the fused model: only a success has one
    return found


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _speedup(speed: Speed | None) -> dict[str, Any] | None:
    """The paired measurement: the speedup (original / fused) and its interval, and the
    ratio (fused / original) it was computed from, with the verdict in words."""
    if speed is None:
        return None
    low, high = speed.low, speed.high
    interval = [1 / high, 1 / low] if low and high else None  # the ratio's, inverted
    return {
        "value": _finite(speed.speedup),
        "interval": interval,
        "ratio": speed.ratio,
        "ratio_interval": [low, high] if low is not None and high is not None else None,
        "confidence": speed.confidence,
        "runs": speed.runs,
        "words": speed.describe(),
    }


def _check(summary: ReportSummary) -> dict[str, Any]:
    return {
        "passed": summary.check_passed,  # None: the check was skipped
        "max_abs_diff": summary.max_abs_diff,
        "reason": summary.check_reason or summary.check_failure,
        "left_out": list(summary.check_left_out),  # sizes the original cannot run at
        # the check failed and the server fell back to the fusions that pass
        "fallback": (
            {"reason": summary.fallback_reason, "dropped": summary.fallback_dropped}
            if summary.fallback_reason
            else None
        ),
    }


def _nodes(summary: ReportSummary) -> dict[str, Any]:
    """The main graph's node counts; ``subgraphs``, the If/Loop/Scan bodies', only when
    the model has a body (as the job's summary)."""
    nodes: dict[str, Any] = {"before": summary.nodes_before, "after": summary.nodes_after}
    if summary.subgraph_nodes is not None:
        bodies = {"before": summary.subgraph_nodes_before, "after": summary.subgraph_nodes_after}
        nodes["subgraphs"] = bodies
    return nodes


def _details(outcome: Any, summary: ReportSummary | None) -> dict[str, Any]:
    job = outcome.job
    details: dict[str, Any] = {
        "profiled": outcome.profiled,
        "idempotency_key": outcome.idempotency_key,
        "registry_version": job.get("registry_version"),
        "created_at": job.get("created_at"),
        "elapsed_s": round(outcome.elapsed_s, 3),
    }
    if summary is None:
        return details
    return {
        **details,
        "target": summary.target,
        "fusions_by_pattern": dict(summary.counts),
        "nodes": _nodes(summary),
        "size_bytes": {"before": summary.size_before_bytes, "after": summary.size_after_bytes},
        "peak_memory_bytes": {
            "before": summary.peak_memory_before_bytes,
            "after": summary.peak_memory_after_bytes,
        },
        "speed": speed_dict(summary.speed),  # every field of the measurement
        "rejected": summary.rejected,  # steps taken back as bugs of autofusion
    }


def submit_document(outcome: Any, *, full: bool = False) -> dict[str, Any]:
    """What ``--json`` prints, in this order; ``full``: the report and the job resource
    are added at the end (``report``, ``job``)."""
    job = outcome.job
    summary = read_report(outcome.report) if outcome.report is not None else None
    speed = summary.speed if summary else None
    gates = [asdict(g) for g in outcome.gates]
    document: dict[str, Any] = {
        "status": job.get("status"),
        "exit_code": outcome.code,
        "message": outcome.message,
        "verdict": speed.verdict if speed else None,
        "speedup": _speedup(speed),
        "fusions": summary.fusions if summary else None,
        "check": _check(summary) if summary else None,
        "gate": ("passed" if all(g["passed"] for g in gates) else "failed") if gates else None,
        "gates": gates,
        "job_id": job.get("id"),
        "reused": getattr(outcome, "reused", None),
        "urls": urls(outcome),
        "details": _details(outcome, summary),
    }
    if full:
        document["report"] = outcome.report
        document["job"] = job
    return document
