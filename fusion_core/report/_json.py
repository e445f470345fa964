"""The JSON report of one optimization: plain data, the contract consumers rely on."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

from fusion_core.pipeline import Result

__all__ = ["REPORT_VERSION", "build_report"]

REPORT_VERSION = 1


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def build_report(
    result: Result, *, model: str | None = None, output: str | None = None
) -> dict[str, Any]:
    """Everything ``optimize`` did, as JSON-serialisable data."""
    return {
        "report_version": REPORT_VERSION,
        "tool": {name: _version(name) for name in ("autofusion", "onnx", "onnx-ir", "onnxruntime")},
        "model": model,
        "output": output,
        "target": result.target,
        "patterns_used": result.patterns_used,
        "prepasses": result.prepasses,
        "rounds": result.rounds,
        "fusions": result.counts,
        "applied": [f.to_dict() for f in result.applied],
        "near_misses": [m.to_dict() for m in result.near_misses],
        "nodes": {
            "before": sum(result.ops_before.values()),
            "after": sum(result.ops_after.values()),
            "by_op_before": dict(sorted(result.ops_before.items())),
            "by_op_after": dict(sorted(result.ops_after.items())),
        },
        "timings_s": {k: round(v, 6) for k, v in result.timings.items()},
        "check": result.check.to_dict() if result.check is not None else None,
    }
