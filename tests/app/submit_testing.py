"""The CI client's outcome of one job, as ``autofusion submit`` hands it to its
renderings (``_submit_output.facts``, ``_submit_json.submit_document``): a succeeded job
with ``report``, no gates, not profiled."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any


def submit_outcome(report: dict[str, Any]) -> SimpleNamespace:
    job = {"id": "j1", "status": "succeeded", "links": {}, "summary": {}}
    return SimpleNamespace(
        job=job,
        report=report,
        server="http://af.example.com",
        url="http://af.example.com/v1/jobs/j1",
        profiled=False,
        reused=None,
        code=0,
        message="ok",
        gates=[],
        elapsed_s=1.0,
        idempotency_key=None,
    )
