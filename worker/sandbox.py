"""The job's sandbox: ``python -P -m autofusion.worker.sandbox FOLDER`` runs one optimization.

Pure: no database, no broker, no settings. The worker prepares FOLDER::

    job.json        {"model": NAME, "config": {...OptimizeConfig...},
                     "memory_limit_mb": N, "parent_pid": PID,
                     "job_id": ID, "request_id": ID or null, "log_format": "json"|"text",
                     "trace_phases": BOOL}
    patterns.json   [pattern spec, ...]   (the registry snapshot)
    verdicts.json   the verdicts measured selection may reuse (measured jobs only)
    input/NAME      the model, and its external-data files beside it

and the sandbox writes ``output/fused.onnx`` (+ ``.data`` past 2 GB),
``output/report.json`` with its renderings ``report.html`` and ``report.md`` (and,
when the config asks to profile, ``profile_trace.json``: onnxruntime's own profiler
trace of a few runs of the fused model; after measured selection, ``verdicts.json``:
the verdicts it measured), or
``output/error.json`` ``{"kind", "message"}`` with kind ``model``, ``config``,
``pattern``, ``check`` (the fused model failed its check: the report and renderings are
written, the fused model only with ``keep_failed``; these four fail the job at once),
``memory`` (counts as a crash) or ``internal``. Progress goes to stdout as JSON lines
``{"stage": "prepasses", "progress": 0.1}``; everything else anyone prints goes to
stderr, which the worker keeps in ``sandbox.log``: the sandbox's own log lines there are
in the worker's format and carry the job's request id and job id. When the worker
traces (``trace_phases``), ``output/phases.jsonl`` says when each phase began.

This module is the optimization and its files; ``app.services.sandbox`` is the rest,
shared with the API's sandbox: the memory limit set before anything big is imported (a
model, or an onnxruntime, that exhausts memory fails here, not in the worker), the exit
when the worker that started it dies (a ``kill -9`` of the worker leaves no orphan
behind), the progress stream and the error file. ``worker.supervise`` starts it.

For tests only, ``AUTOFUSION_SANDBOX_TEST_CRASH`` makes the sandbox misbehave just before
it optimizes: ``segv`` (a segmentation fault), ``sleep:SECONDS`` (waiting) or
``spin:SECONDS`` (computing) or ``write:MB`` (a file that big), or, as ``profiling:MODE``,
any of these once profiling starts (the fused model saved and checked). The worker sets
it nowhere; a job's config cannot reach it.
"""

from __future__ import annotations

# Only the standard library before the memory limit is in place.
import errno
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from autofusion.app.services.sandbox import (  # standard library only
    Progress,
    SandboxKind,
    is_out_of_memory,
    sandbox_main,
)

__all__ = [
    "ERROR_FILE",
    "FUSED_FILE",
    "INPUT_DIR",
    "JOB_FILE",
    "LOG_FILE",
    "OPTIMIZE",
    "OUTPUT_DIR",
    "PATTERNS_FILE",
    "PHASES_END",
    "PHASES_FILE",
    "PROFILE_TRACE_FILE",
    "REPORT_FILE",
    "REPORT_HTML_FILE",
    "REPORT_MARKDOWN_FILE",
    "REGIONS_FILE",
    "REPRODUCERS_FILE",
    "TEST_CRASH_ENV",
    "USER_ERROR_KINDS",
    "VERDICTS_FILE",
    "describe_validation_error",
    "fused_file",
]

JOB_FILE = "job.json"
PATTERNS_FILE = "patterns.json"
INPUT_DIR = "input"
OUTPUT_DIR = "output"
FUSED_FILE = "fused.onnx"  # the output's name in a job file that names none (older workers)
REPORT_FILE = "report.json"
REPORT_HTML_FILE = "report.html"
REPORT_MARKDOWN_FILE = "report.md"
PROFILE_TRACE_FILE = "profile_trace.json"
# The fused regions' nodes, for the dashboard to draw without loading the models.
REGIONS_FILE = "regions.json"
REPRODUCERS_FILE = "reproducers.zip"  # only when a step was taken back as a bug
# Measured selection's verdicts: FOLDER/verdicts.json, those it may reuse (the worker's,
# from the service's store); output/verdicts.json, those it measured (the worker stores
# them once the job has succeeded, as untrusted input).
VERDICTS_FILE = "verdicts.json"
ERROR_FILE = "error.json"
# The phases' start times, when the job is traced; the last line (PHASES_END) ends them.
PHASES_FILE = "phases.jsonl"
PHASES_END = "end"
LOG_FILE = "sandbox.log"
TEST_CRASH_ENV = "AUTOFUSION_SANDBOX_TEST_CRASH"
USER_ERROR_KINDS = frozenset({"model", "config", "pattern", "check"})
# optimize's phases (fusion_core.pipeline, on_phase) reported as stages of their own, so
# the job's phases say where the time went; load and the pre-passes stay "prepasses".
# Each is heard once a job: measured selection and progressive mode replace fuse/check.
OPTIMIZE_STAGES = {
    "fuse": ("fusing", 0.3),
    "check": ("checking", 0.6),
    "measure": ("measuring", 0.3),
    "progressive": ("progressive", 0.3),
    "fallback": ("falling_back", 0.65),  # after a failed check, unless strict
}
PhaseMark = Callable[[str], None]  # called with each phase's name as it begins


def _on_phase(progress: Progress, mark: PhaseMark):
    def heard(name: str) -> None:
        mark(name)
        if name in OPTIMIZE_STAGES:
            progress(*OPTIMIZE_STAGES[name])

    return heard


def _phase_log(path: Path | None) -> PhaseMark:
    """With ``trace_phases`` (the worker traces): each phase's name and start (ns since
    the epoch) appended to ``output/phases.jsonl`` as it begins, for the worker to export
    as spans (``worker.supervise``). The sandbox runs no OpenTelemetry of its own: it
    may have no network, and imports only the standard library before its limits. A line
    at a time, so that a crash keeps the phases before it."""
    if path is None:
        return lambda _name: None

    def mark(name: str) -> None:
        try:
            with path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"phase": name, "at_ns": time.time_ns()}) + "\n")
        except Exception:  # a lost line costs a span, never the job (nor hides its error)
            pass

    return mark


def _start_logging(job: dict[str, Any]) -> None:
    """Log lines to stderr (``sandbox.log``) in the worker's format, each with the job's
    request id and job id (``job.json``: ``log_format``, ``request_id``, ``job_id``)."""
    from autofusion.app.core.logs import configure_logging, set_context

    configure_logging("INFO", job.get("log_format", "text"))
    set_context(request_id=job.get("request_id"), job_id=job.get("job_id"))
    logging.getLogger(__name__).info("sandbox: optimizing %s", job.get("model"))


def fused_file(job: dict[str, Any]) -> str:
    """The fused model's file in the output folder: ``job.json``'s ``output``, the name the
    download gives it (``<stem>.fused.onnx``), so that a data file written beside it,
    ``<stem>.fused.onnx.data``, is named as the model names it wherever a client saves
    the two; ``fused.onnx`` for a job file written before there was one."""
    return Path(job.get("output") or FUSED_FILE).name


def _optimize(folder: Path, job: dict[str, Any], progress: Progress) -> None:
    _start_logging(job)
    mark = _phase_log(folder / OUTPUT_DIR / PHASES_FILE if job.get("trace_phases") else None)
    mark("setup")  # imports and the registry's patterns compiled
    try:
        _run(folder, job, progress, mark)
    finally:
        mark(PHASES_END)


def _run(folder: Path, job: dict[str, Any], progress: Progress, mark: PhaseMark) -> None:
    progress("prepasses", 0.1)
    from autofusion.fusion_core import OptimizeConfig, RunFiles, run
    from autofusion.fusion_core.catalog import compile_all

    config = OptimizeConfig.model_validate(job["config"])
    specs = json.loads((folder / PATTERNS_FILE).read_text(encoding="utf-8"))
    patterns = compile_all(specs)
    _test_crash()
    output = folder / OUTPUT_DIR
    files = RunFiles(
        report=output / REPORT_FILE,
        markdown=output / REPORT_MARKDOWN_FILE,
        html=output / REPORT_HTML_FILE,
        regions=output / REGIONS_FILE,
        trace=output / PROFILE_TRACE_FILE,
        reproducers=output / REPRODUCERS_FILE,
        verdicts=output / VERDICTS_FILE,
    )
    fused_name = fused_file(job)
    outcome = run(
        folder / INPUT_DIR / job["model"],
        output / fused_name,
        config,
        files=files,
        patterns=patterns,
        names=(job["model"], fused_name),
        registry_version=job.get("registry_version"),
        on_stage=_misbehaving_while_profiling(progress),
        on_phase=_on_phase(progress, mark),
        # as the input came: one file, or the weights streamed to <output>.data (and past
        # 2 GB a data file always); the job's downloads serve both files
        external_data=None,
    )
    if outcome.failed:  # the report stays: it says what the check saw
        raise CheckFailed(_check_message(outcome.result.check, kept=outcome.written))


class CheckFailed(Exception):
    """The fused model failed its check: the job fails, with its report kept."""


def _check_message(check: Any, *, kept: bool) -> str:
    from autofusion.fusion_core.validate import describe_failure

    tail = "; the fused model is kept (keep_failed)" if kept else ""
    return f"{describe_failure(check)}; see the report{tail}"


def _misbehaving_while_profiling(progress: Progress) -> Progress:
    """``progress``; for tests (``profiling:MODE``), ``_test_crash(MODE)`` once profiling
    starts."""
    when, _, mode = os.environ.get(TEST_CRASH_ENV, "").partition(":")
    if when != "profiling":
        return progress

    def heard(stage: str, fraction: float) -> None:
        progress(stage, fraction)
        if stage == "profiling":
            _test_crash(mode)

    return heard


def _test_crash(mode: str | None = None) -> None:
    mode = os.environ.get(TEST_CRASH_ENV, "") if mode is None else mode
    if mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif mode.startswith("sleep:"):
        time.sleep(float(mode.partition(":")[2]))
    elif mode.startswith("write:"):  # a file of that many MB, as a model that grows
        with open("grown.bin", "wb") as f:
            for _ in range(int(mode.partition(":")[2])):
                f.write(b"\0" * 1024 * 1024)
    elif mode.startswith("spin:"):  # computing, as a model that hangs constant folding
        end = time.monotonic() + float(mode.partition(":")[2])
        while time.monotonic() < end:
            pass


def _kind_of(exc: BaseException) -> str:
    if isinstance(exc, CheckFailed):
        return "check"
    if is_out_of_memory(exc):
        return "memory"
    if _too_big_a_file(exc):
        return "model"
    try:
        from pydantic import ValidationError

        from autofusion.fusion_core.errors import (
            ConfigError,
            FusionError,
            ModelLoadError,
            PatternError,
            UnsafeModelError,
        )
    except BaseException:  # the failure was in these imports: nothing more to learn
        return "internal"
    if isinstance(exc, ModelLoadError | UnsafeModelError):
        return "model"
    if isinstance(exc, PatternError):
        return "pattern"
    if isinstance(exc, ConfigError | FusionError | ValidationError):
        return "config"
    return "internal"


def _too_big_a_file(exc: BaseException | None) -> bool:
    """A write past RLIMIT_FSIZE (``job_file_size_limit_mb``): EFBIG, here or as a cause."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno == errno.EFBIG:
            return True
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return False


def describe_validation_error(exc: Any) -> str:
    """A pydantic ValidationError in one line: ``field: message; ...``."""
    from autofusion.fusion_core.errors import describe_fields, field_errors

    return describe_fields(field_errors(exc, default="<config>"))


def _message(kind: str, exc: BaseException) -> str:
    if kind == "memory":
        return "ran out of memory"
    if _too_big_a_file(exc):
        return (
            "the optimization wrote a file past the largest this server allows "
            "(AUTOFUSION_JOB_FILE_SIZE_LIMIT_MB): the model grows too much as it is "
            'optimized; fold fewer constants ("fold_constants": false) or ask the operator '
            "to raise the limit"
        )
    if kind == "config" and hasattr(exc, "errors") and callable(exc.errors):
        return f"invalid options: {describe_validation_error(exc)}"
    if kind in USER_ERROR_KINDS:
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _describe(exc: BaseException) -> dict[str, str]:
    """``output/error.json``: the kind of failure and what to tell the user."""
    kind = _kind_of(exc)
    return {"kind": kind, "message": _message(kind, exc)}


OPTIMIZE = SandboxKind(
    module="autofusion.worker.sandbox",
    request_file=JOB_FILE,
    error_file=f"{OUTPUT_DIR}/{ERROR_FILE}",
    result_file=f"{OUTPUT_DIR}/{REPORT_FILE}",
    log_file=LOG_FILE,
    work=_optimize,
    describe=_describe,
    # onnxruntime resolves the external-data references of a model it is handed as
    # bytes (fusion_core's check does that) against the working directory.
    work_dir=INPUT_DIR,
    keep_env=(TEST_CRASH_ENV,),
)

if __name__ == "__main__":
    sys.exit(sandbox_main(OPTIMIZE))
