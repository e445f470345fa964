"""``run``: the one path from a model file to the files a user gets.

optimize -> save the fused model (its weights in a data file beside it, streamed one
tensor at a time, when the input had one or past 2 GB) -> profile it and measure memory
(when the config asks) -> build the report (with the run's own memory by phase:
``memory.PhaseMemory``) -> write the report, its renderings, the region data, the trace
and (measured selection) the verdicts measured.
The CLI's ``optimize`` and the service's sandbox both call this, so the two cannot drift
apart any more: they used to write the same steps twice, with different profiling seeds.
A fused model that failed its check is written only with ``keep_failed``, and the
report is written either way, since it says what the check saw.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from autofusion.fusion_core.catalog import CompiledPattern
from autofusion.fusion_core.config import OptimizeConfig
from autofusion.fusion_core.ir import save_model
from autofusion.fusion_core.onefile import load_without_weights
from autofusion.fusion_core.pipeline.memory import PhaseMemory
from autofusion.fusion_core.pipeline.modes import optimize
from autofusion.fusion_core.pipeline.reproducer import reproducer_names, reproducers_zip
from autofusion.fusion_core.pipeline.result import PROFILE_UNFINISHED, Result
from autofusion.fusion_core.profiling import (
    ModelSize,
    ProfileOptions,
    measure_memory,
    model_size,
    profile_models,
)
from autofusion.fusion_core.profiling.verdicts import write_verdicts
from autofusion.fusion_core.report import (
    build_report,
    format_markdown,
    region_pictures,
    render_html,
)

__all__ = ["RunFiles", "RunOutcome", "run"]

logger = logging.getLogger(__name__)

TRACE_RUNS = 3  # runs of the fused model in onnxruntime's raw profiler trace


@dataclass(frozen=True)
class RunFiles:
    """Where to write what, besides the fused model; None: not written."""

    report: Path | None = None  # report.json
    markdown: Path | None = None  # report.md
    html: Path | None = None  # report.html (pictures of the fused regions)
    regions: Path | None = None  # the regions' nodes, for a viewer without the models
    trace: Path | None = None  # onnxruntime's profiler trace, when profiling
    # reproducers.zip: each step taken back as a bug, its region as an ONNX file
    reproducers: Path | None = None
    # verdicts.json: what measured selection measured in this run (Result.verdicts, in
    # the verdicts format), for the service to keep; only in measured mode
    verdicts: Path | None = None


@dataclass
class RunOutcome:
    result: Result
    report: dict[str, Any]
    written: bool  # the fused model is at the output path
    failed: bool  # the check failed (the report says why)


def run(
    model_path: str | os.PathLike,
    output_path: str | os.PathLike,
    config: OptimizeConfig,
    *,
    files: RunFiles = RunFiles(),
    patterns: Sequence[CompiledPattern] | None = None,
    feeds: Sequence[Mapping[str, np.ndarray]] | None = None,
    names: tuple[str, str] | None = None,
    registry_version: int | str | None = None,
    on_stage: Callable[[str, float], None] | None = None,
    on_phase: Callable[[str], None] | None = None,
    external_data: bool | None = None,
) -> RunOutcome:
    """Optimize ``model_path`` into ``output_path`` and write ``files``. ``names`` are the
    (model, output) names the report shows (default: the paths); ``on_stage`` hears
    ``saving``, ``profiling`` and ``report`` with a progress fraction; ``on_phase`` every
    phase by name as it starts: ``optimize``'s, then those three. The report's
    ``optimize_memory`` is this process's peak memory at the end of each phase
    (``memory.PhaseMemory``) and the peak predicted for the model and config.
    ``external_data``: the fused model's weights go to ``<output>.data`` beside it,
    streamed (True), or inside the file (False: one file, as the service hands back);
    None: as the input came. Past 2 GB they go to the data file whatever it says."""
    phase = PhaseMemory(on_phase)

    def stage(name: str, progress: float) -> None:
        phase(name)
        if on_stage:
            on_stage(name, progress)

    result = optimize(model_path, config, patterns=patterns, feeds=feeds, on_phase=phase)
    if files.verdicts is not None and config.mode == "measured":
        # first: what was timed stays true whatever happens to the rest of the run
        Path(files.verdicts).parent.mkdir(parents=True, exist_ok=True)
        write_verdicts(files.verdicts, result.verdicts)  # none measured: an empty list
    stage("saving", 0.8)
    failed = result.check is not None and not result.check.passed
    written = not failed or config.keep_failed
    size = model_size(model_path)  # the input's bytes, and whether it has a data file
    external = _external_output(size, external_data)
    if written:
        save_model(result.model, output_path, external_data=external)
    own_memory = partial(phase.record, size and size.total_bytes, config, external_data=external)
    paths = (model_path, output_path if written else None)
    report_with = _reporter(result, config, paths, names, registry_version, external)
    profile = memory = None
    if config.profile and not failed:
        if files.report is not None:
            _write_unfinished(report_with(optimize_memory=own_memory()), files.report)
        stage("profiling", 0.82)
        profile, memory = _measure(model_path, output_path, config, result, feeds, files.trace)
    report = report_with(profile=profile, memory=memory, optimize_memory=own_memory())
    stage("report", 0.85)
    _write_files(report, files, model_path, output_path if written else None)
    _write_reproducers(result, files.reproducers)
    return RunOutcome(result, report, written, failed)


def _reporter(
    result, config, paths, names, registry_version, external_data
) -> Callable[..., dict[str, Any]]:
    """``build_report`` of this run, but for what profiling and the memory add; ``paths``:
    the input's and the fused model's (None: not written)."""
    model_path, fused_path = paths
    model_name, output_name = names or (str(model_path), str(fused_path))
    return partial(
        build_report,
        result,
        model=model_name,
        output=output_name if fused_path is not None else None,
        model_file=model_path,
        output_file=fused_path,
        config=config,
        registry_version=registry_version,
        external_data=external_data,
    )


def _external_output(size: ModelSize | None, asked: bool | None) -> bool:
    """Whether the fused model's weights go to a data file: as asked, else as the input's
    did (``size``: the input's bytes, None when it is not a file)."""
    if asked is not None:
        return asked
    return size is not None and size.external_data_bytes > 0


def _write_unfinished(report: dict[str, Any], path: Path) -> None:
    """The report as it stands before profiling, its profile saying it did not finish.
    Profiling may take longer than the run is given (a worker's time limit): the checked
    model is saved by then, and this report goes with it until the finished one replaces
    it (worker/execute.py keeps both when only profiling ran out of time)."""
    _write(path, json.dumps({**report, "profile": {"error": PROFILE_UNFINISHED}}, indent=2) + "\n")


def _write_reproducers(result: Result, path: Path | None) -> None:
    """``reproducers.zip`` when a step was taken back with a region to show; else none."""
    names = reproducer_names(result.rejected)
    found = [(n, r.reproducer) for n, r in zip(names, result.rejected, strict=True) if n]
    if path is not None and found:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_bytes(reproducers_zip(found))


def _measure(model_path, output_path, config, result, feeds, trace_path):
    """The profile (latency, per-node times), each model's peak memory and the trace,
    all on the inputs the check used first."""
    check = result.check
    dims = check.profiles[0].dims if check and check.profiles else config.check.dims
    sample = (feeds or [None])[0]
    options = ProfileOptions(seed=config.check.seed, dims=dims)
    profile = profile_models(
        model_path, output_path, feeds=sample, options=options,
        trace_path=trace_path, trace_runs=TRACE_RUNS,
    )  # fmt: skip
    memory = measure_memory(
        model_path, output_path, feeds=sample, seed=options.seed, dims=dims,
        threads=options.threads, providers=options.providers,
    )  # fmt: skip
    return profile.to_dict(), memory.to_dict()


def _write_files(report: dict, files: RunFiles, model_path, fused_path) -> None:
    if files.report is not None:
        _write(files.report, json.dumps(report, indent=2) + "\n")
    if files.markdown is not None:
        _write(files.markdown, format_markdown(report))
    if files.html is None and files.regions is None:
        return
    # The pictures need the graphs only: the weights stay on disk.
    original = load_without_weights(model_path)
    fused = load_without_weights(fused_path) if fused_path else None
    pictures = None  # drawn once (shape inference on both graphs), for both files
    if fused is not None and report.get("applied"):
        pictures = region_pictures(report["applied"], original, fused)
    if files.html is not None:
        _write(files.html, render_html(report, pictures=pictures))
    if files.regions is not None and pictures is not None:
        _write(files.regions, json.dumps(pictures) + "\n")


def _write(path: Path, text: str) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")
