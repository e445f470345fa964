"""The JSON report of one optimization: plain data, the contract consumers rely on.

Its JSON Schema is ``docs/report.schema.json``, generated from ``_schema.py``.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.pipeline import Result, reproducer_names
from autofusion.fusion_core.report._footprint import memory_section, size_section
from autofusion.fusion_core.report._provenance import fusion_entries
from autofusion.fusion_core.report._reader import measured_speed, speed_section

__all__ = ["REPORT_VERSION", "build_report", "file_sha256"]

REPORT_VERSION = 2
_CHUNK = 1 << 20

PathArg = str | os.PathLike | None


def _version(package: str) -> str | None:
    try:
        return version(package)
    except PackageNotFoundError:
        return None


def file_sha256(path: PathArg) -> str | None:
    """The sha256 of a file, or None when there is no path or no such file."""
    if path is None or not Path(path).is_file():
        return None
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def build_report(
    result: Result,
    *,
    model: str | None = None,
    output: str | None = None,
    model_file: PathArg = None,
    output_file: PathArg = None,
    config: OptimizeConfig | None = None,
    registry_version: int | str | None = None,
    profile: dict[str, Any] | None = None,
    rollbacks: list[dict[str, Any]] | None = None,
    memory: dict[str, Any] | None = None,
    optimize_memory: dict[str, Any] | None = None,
    external_data: bool = False,
) -> dict[str, Any]:
    """Everything ``optimize`` did, as JSON-serialisable data.

    ``model``/``output`` name the files in the report; their sha256 is taken from
    ``model_file``/``output_file`` when given (a name may not be a path from here),
    else from ``model``/``output`` when those are existing files. ``profile`` is a
    ``ProfileReport.to_dict()`` (``fusion_core.profiling``). ``rollbacks`` are
    ``{"pattern", "nodes", "error", ...}``, by default the result's own (progressive
    validation); null when neither has any record of a progressive run.

    ``size`` is always measured: the input file (``model_file``, else ``model``) with
    its external data, against the fused file (``output_file``, else ``output``), or,
    when no file holds the fused model, ``result.model`` serialized into a scratch
    folder (with its weights in a data file when ``external_data``, as ``run`` saves
    it). ``memory`` is a ``fusion_core.profiling.footprint.MemoryComparison``'s
    ``to_dict()``; the report's ``memory`` entry is null unless it or ``profile`` is
    given. ``optimize_memory`` is the optimizing process's own peak memory by phase and
    its prediction (``fusion_core.pipeline.memory.PhaseMemory.record``; ``run`` gives it),
    null when not given.
    """
    model_path = model_file if model_file is not None else model
    output_path = output_file if output_file is not None else output
    return {
        "report_version": REPORT_VERSION,
        "tool": {name: _version(name) for name in ("autofusion", "onnx", "onnx-ir", "onnxruntime")},
        "model": model,
        "output": output,
        "digests": {
            "model_sha256": file_sha256(model_path),
            "output_sha256": file_sha256(output_path),
        },
        "size": size_section(model_path, output_path, result.model, external_data=external_data),
        "config": config.model_dump(mode="json") if config is not None else None,
        "registry_version": registry_version,
        **_what_was_fused(result, profile),
        **_what_was_seen(result, profile, memory, rollbacks),
        "optimize_memory": optimize_memory,
    }


def _what_was_fused(result: Result, profile: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "target": result.target,
        "patterns_used": result.patterns_used,
        "prepasses": result.prepasses,
        "folding": _folding(result),
        "rounds": result.rounds,
        "fusions": result.counts,
        "applied": fusion_entries([f.to_dict() for f in result.applied], profile),
        "near_misses": [m.to_dict() for m in result.near_misses],
        "nodes": {
            **_counts(result.ops_before, result.ops_after),
            "subgraphs": _counts(result.subgraph_ops_before, result.subgraph_ops_after)
            if result.subgraph_ops_before or result.subgraph_ops_after
            else None,
        },
        "timings_s": {k: round(v, 6) for k, v in result.timings.items()},
    }


def _counts(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, Any]:
    return {
        "before": sum(before.values()),
        "after": sum(after.values()),
        "by_op_before": dict(sorted(before.items())),
        "by_op_after": dict(sorted(after.items())),
    }


def _what_was_seen(
    result: Result,
    profile: dict[str, Any] | None,
    memory: dict[str, Any] | None,
    rollbacks: list[dict[str, Any]] | None,
) -> dict[str, Any]:
    """The check, the measurements and the validation extras."""
    return {
        "check": result.check.to_dict() if result.check is not None else None,
        "profile": profile,
        "speed": speed_section(profile) or measured_speed(result.measurement),
        "measurement": result.measurement,
        "memory": memory_section(memory, profile),
        "rollbacks": _rollbacks(result, rollbacks),
        "rejected": _rejected(getattr(result, "rejected", [])),
        "fallback": getattr(result, "fallback", None),
        "regions": result.regions.to_dict() if result.regions is not None else None,
        "structure": list(result.structure),
        "selections": list(result.selections),
        "switches": list(result.switches),
        "precision": result.precision.to_dict() if result.precision is not None else None,
        "left_alone": list(getattr(result, "left_alone", [])),
    }


def _folding(result: Result) -> dict[str, Any] | None:
    record = getattr(result, "folding", None)
    return record.to_dict() if record is not None else None


def _rejected(rejected: list) -> list[dict[str, Any]]:
    """Each step taken back, with the name of its reproducer in ``reproducers.zip``."""
    names = reproducer_names(rejected)
    return [r.to_dict() | {"reproducer": name} for r, name in zip(rejected, names, strict=True)]


def _rollbacks(result: Result, given: list[dict[str, Any]] | None) -> list[dict] | None:
    records = given if given is not None else getattr(result, "rollbacks", None)
    return [dict(r) for r in records] if records is not None else None
