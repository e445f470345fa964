"""The report's ``size`` and ``memory`` entries, and the one way the renderings word them.

``size`` is in every report: the input's bytes on disk (its file and external data)
against the fused model's (``fusion_core.profiling.footprint``). ``memory`` is in profiled
reports: each model's peak resident memory in its own process while onnxruntime
creates a session and runs it, with onnxruntime's allocator peak from the profile's
trace beside it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import onnx_ir as ir

from autofusion.fusion_core.profiling.footprint import model_size, serialized_size
from autofusion.fusion_core.report._reader import read_report
from autofusion.fusion_core.report._units import bytes_text, change_of

__all__ = [
    "bytes_text",
    "change_text",
    "memory_line",
    "memory_section",
    "size_line",
    "size_section",
]

PathArg = str | os.PathLike | None

PROCESS_MEASURE = (
    "process peak resident memory (VmHWM) while onnxruntime creates one session "
    "({level}, {providers}, {threads} thread(s)) and runs it {runs} times, in a fresh "
    "process per model, less that process's resident memory just before the session "
    "(Python, numpy, onnxruntime and the inputs)"
)
NOT_MEASURED = "not measured: the profile did not measure process memory"
ALLOCATOR_MEASURE = (
    "onnxruntime's CPU allocator high-water mark in the profiler's trace ({level}): "
    "activations, workspaces and pre-packed weights, not all weights nor the arena's slack"
)


def size_section(
    before_path: PathArg, after_path: PathArg, fused: ir.Model, *, external_data: bool = False
) -> dict[str, Any]:
    """Bytes on disk before and after; the fused model serialized when no file holds it
    (with its weights in a data file when ``external_data``: as ``run`` saves it)."""
    before = model_size(before_path)
    after = model_size(after_path)
    measured_from = "file"
    if after is None:
        after, measured_from = serialized_size(fused, external_data=external_data), "serialized"
    return {
        "before_bytes": before.total_bytes if before else None,
        "after_bytes": after.total_bytes,
        "ratio": _ratio(after.total_bytes, before.total_bytes if before else None),
        "before_external_data_bytes": before.external_data_bytes if before else None,
        "after_external_data_bytes": after.external_data_bytes,
        "before_files": before.files if before else None,
        "after_files": after.files,
        "after_measured_from": measured_from,
    }


def memory_section(
    memory: Mapping[str, Any] | None, profile: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """From a ``MemoryComparison.to_dict()`` and a ``ProfileReport.to_dict()``; None
    when neither was measured."""
    if not isinstance(memory, Mapping) and not isinstance(profile, Mapping):
        return None
    memory = memory if isinstance(memory, Mapping) else {}
    original, fused = _map(memory.get("original")), _map(memory.get("fused"))
    nodes = _map(_map(profile).get("nodes"))
    allocator = {k: _map(_map(nodes.get(k)).get("memory")) for k in ("original", "fused")}
    before, after = _int(original.get("peak_bytes")), _int(fused.get("peak_bytes"))
    return {
        "measure": PROCESS_MEASURE.format(
            level=memory.get("level"),
            providers=", ".join(memory.get("providers") or []),
            threads=memory.get("threads"),
            runs=memory.get("runs"),
        )
        if memory
        else NOT_MEASURED,
        "before_bytes": before,
        "after_bytes": after,
        "ratio": _ratio(after, before),
        "resident_before_bytes": _int(original.get("resident_bytes")),
        "resident_after_bytes": _int(fused.get("resident_bytes")),
        "allocator_peak_before_bytes": _int(allocator["original"].get("allocator_peak_bytes")),
        "allocator_peak_after_bytes": _int(allocator["fused"].get("allocator_peak_bytes")),
        "allocator_measure": ALLOCATOR_MEASURE.format(
            level=_map(nodes.get("original")).get("level") or "ORT_DISABLE_ALL"
        ),
        "errors": [e for e in (original.get("error"), fused.get("error")) if e],
    }


def size_line(report: Mapping[str, Any]) -> str | None:
    """``1.51 MiB -> 1.50 MiB (-0.6%)``, saying when the fused model was not written;
    None without both sizes."""
    summary = read_report(report)
    text = change_text(summary.size_before_bytes, summary.size_after_bytes)
    if text and _map(report.get("size")).get("after_measured_from") == "serialized":
        text += " (the fused model not written: its size as it would be saved)"
    return text


def memory_line(report: Mapping[str, Any]) -> str | None:
    """The peak memory before -> after and what it is; why not, when it was not
    measured; None when the report has no memory entry (not profiled)."""
    memory = _map(report.get("memory"))
    if not memory:
        return None
    summary = read_report(report)
    text = change_text(summary.peak_memory_before_bytes, summary.peak_memory_after_bytes)
    if text is None:
        errors = "; ".join(memory.get("errors") or []) or memory.get("measure")
        return f"not measured ({errors})"
    return f"{text} (process peak resident memory of an onnxruntime session and its runs)"


def change_text(before: int | None, after: int | None) -> str | None:
    if before is None or after is None:
        return None
    change = change_of(before, after)
    shown = f"{bytes_text(before)} -> {bytes_text(after)}"
    return f"{shown} ({change})" if change else shown


def _ratio(after: int | None, before: int | None) -> float | None:
    return after / before if before and after is not None else None


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None
