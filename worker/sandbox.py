"""The sandboxed child: ``python -m autofusion.worker.sandbox FOLDER`` runs one optimization.

Pure: no database, no broker, no settings. The worker prepares FOLDER::

    job.json        {"model": NAME, "config": {...OptimizeConfig...},
                     "memory_limit_mb": N, "parent_pid": PID,
                     "job_id": ID, "request_id": ID or null, "log_format": "json"|"text"}
    patterns.json   [pattern spec, ...]   (the registry snapshot)
    input/NAME      the model, and its external-data files beside it

and the child writes ``output/fused.onnx`` (+ ``.data`` past 2 GB),
``output/report.json`` with its renderings ``report.html`` and ``report.md`` (and,
when the config asks to profile, ``profile_trace.json``: onnxruntime's own profiler
trace of a few runs of the fused model), or
``output/error.json`` ``{"kind", "message"}`` with kind ``model``, ``config``,
``pattern``, ``check`` (the fused model failed its check: the report and renderings are
written, the fused model only with ``keep_failed``; these four fail the job at once),
``memory`` (counts as a crash) or ``internal``. Progress goes to stdout as JSON lines
``{"stage": "prepasses", "progress": 0.1}``; everything else anyone prints goes to
stderr, which the worker keeps in ``sandbox.log``: the child's own log lines there are
in the worker's format and carry the job's request id and job id.

The address-space limit is set before anything big is imported, so a model (or an
onnxruntime) that exhausts memory fails here, not in the worker. A thread exits the
child if the worker that started it dies, so a ``kill -9`` of the worker leaves no
orphan behind.

For tests only, ``AUTOFUSION_SANDBOX_TEST_CRASH`` makes the child misbehave just before
it optimizes: ``segv`` (a segmentation fault) or ``sleep:SECONDS``. The worker sets it
nowhere; a job's config cannot reach it.
"""

from __future__ import annotations

# Only the standard library before the memory limit is in place.
import errno
import json
import logging
import os
import resource
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any, TextIO

from autofusion.app.services.sandbox_env import exit_with_parent  # standard library only

__all__ = [
    "ERROR_FILE",
    "FUSED_FILE",
    "INPUT_DIR",
    "JOB_FILE",
    "LOG_FILE",
    "PATTERNS_FILE",
    "PROFILE_TRACE_FILE",
    "REPORT_FILE",
    "REPORT_HTML_FILE",
    "REPORT_MARKDOWN_FILE",
    "REGIONS_FILE",
    "TEST_CRASH_ENV",
    "MEMORY_HINTS",
    "USER_ERROR_KINDS",
    "describe_validation_error",
    "main",
]

JOB_FILE = "job.json"
PATTERNS_FILE = "patterns.json"
INPUT_DIR = "input"
OUTPUT_DIR = "output"
FUSED_FILE = "fused.onnx"
REPORT_FILE = "report.json"
REPORT_HTML_FILE = "report.html"
REPORT_MARKDOWN_FILE = "report.md"
PROFILE_TRACE_FILE = "profile_trace.json"
# The fused regions' nodes, for the dashboard to draw without loading the models.
REGIONS_FILE = "regions.json"
ERROR_FILE = "error.json"
LOG_FILE = "sandbox.log"
TEST_CRASH_ENV = "AUTOFUSION_SANDBOX_TEST_CRASH"
USER_ERROR_KINDS = frozenset({"model", "config", "pattern", "check"})
EXIT_ERROR = 3  # error.json written


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m autofusion.worker.sandbox FOLDER\n")
        return 2
    folder = Path(argv[0])
    output = folder / OUTPUT_DIR
    output.mkdir(exist_ok=True)
    try:
        job = json.loads((folder / JOB_FILE).read_text(encoding="utf-8"))
        _limit_memory(int(job["memory_limit_mb"]))
        exit_with_parent(int(job["parent_pid"]))
        _start_logging(job)
        _optimize(folder, job, _progress_stream())
    except BaseException as exc:  # every failure becomes error.json, then an exit code
        kind = _kind_of(exc)
        _log_failure(kind, exc)
        _write_json(output / ERROR_FILE, {"kind": kind, "message": _message(kind, exc)})
        return EXIT_ERROR
    return 0


def _start_logging(job: dict[str, Any]) -> None:
    """Log lines to stderr (``sandbox.log``) in the worker's format, each with the job's
    request id and job id (``job.json``: ``log_format``, ``request_id``, ``job_id``)."""
    from autofusion.app.core.logs import configure_logging, set_context

    configure_logging("INFO", job.get("log_format", "text"))
    set_context(request_id=job.get("request_id"), job_id=job.get("job_id"))
    logging.getLogger(__name__).info("sandbox: optimizing %s", job.get("model"))


def _log_failure(kind: str, exc: BaseException) -> None:
    try:
        logging.getLogger(__name__).error("sandbox: failed (%s)", kind, exc_info=exc)
    except BaseException:  # out of memory even for that: the bare traceback
        traceback.print_exc()


def _limit_memory(megabytes: int) -> None:
    limit = megabytes * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _progress_stream() -> TextIO:
    """Keep the real stdout for progress; send fd 1 (C libraries, print) to stderr."""
    stream = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    return stream


def _emit(stream: TextIO, stage: str, progress: float) -> None:
    stream.write(json.dumps({"stage": stage, "progress": progress}) + "\n")


# optimize's phases (fusion_core.pipeline, on_phase) reported as stages of their own, so
# the job's phases say where the time went; load and the pre-passes stay "prepasses".
# Each is heard once a job: measured selection and progressive mode replace fuse/check.
OPTIMIZE_STAGES = {
    "fuse": ("fusing", 0.3),
    "check": ("checking", 0.6),
    "measure": ("measuring", 0.3),
    "progressive": ("progressive", 0.3),
}


def _on_phase(stream: TextIO):
    def heard(name: str) -> None:
        if name in OPTIMIZE_STAGES:
            _emit(stream, *OPTIMIZE_STAGES[name])

    return heard


def _optimize(folder: Path, job: dict[str, Any], progress: TextIO) -> None:
    _emit(progress, "prepasses", 0.1)
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
    )
    outcome = run(
        folder / INPUT_DIR / job["model"],
        output / FUSED_FILE,
        config,
        files=files,
        patterns=patterns,
        names=(job["model"], FUSED_FILE),
        registry_version=job.get("registry_version"),
        on_stage=lambda stage, fraction: _emit(progress, stage, fraction),
        on_phase=_on_phase(progress),
    )
    if outcome.failed:  # the report stays: it says what the check saw
        raise CheckFailed(_check_message(outcome.result.check, kept=outcome.written))


class CheckFailed(Exception):
    """The fused model failed its check: the job fails, with its report kept."""


def _check_message(check: Any, *, kept: bool) -> str:
    if check.failure == "original_cannot_run":
        text = check.error  # names the dims to give: the job's config.check.dims
    elif check.failure == "mismatch":
        worst = max(check.outputs, key=lambda o: o.max_abs_diff, default=None)
        where = f" (output {worst.name!r}: {worst.detail})" if worst and worst.detail else ""
        text = f"the fused model does not match the original{where}"
    else:
        text = f"the fused model failed its check: {check.error}"
    tail = "; the fused model is kept (keep_failed)" if kept else ""
    return f"{text}; see the report{tail}"


def _test_crash() -> None:
    mode = os.environ.get(TEST_CRASH_ENV, "")
    if mode == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    elif mode.startswith("sleep:"):
        time.sleep(float(mode.partition(":")[2]))


MEMORY_HINTS = (
    "memoryerror",
    "cannot allocate memory",
    "failed to map segment",
    "bad_alloc",
    "out of memory",
    "memory allocation",
    "can't start new thread",
)


def _kind_of(exc: BaseException) -> str:
    if isinstance(exc, CheckFailed):
        return "check"
    if isinstance(exc, MemoryError) or (isinstance(exc, OSError) and exc.errno == errno.ENOMEM):
        return "memory"
    if isinstance(exc, ImportError | RuntimeError) and any(
        hint in str(exc).lower() for hint in MEMORY_HINTS
    ):
        return "memory"
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


def describe_validation_error(exc: Any) -> str:
    """A pydantic ValidationError in one line: ``field: message; ...``."""
    from autofusion.fusion_core.errors import describe_fields, field_errors

    return describe_fields(field_errors(exc, default="<config>"))


def _message(kind: str, exc: BaseException) -> str:
    if kind == "memory":
        return "ran out of memory"
    if kind == "config" and hasattr(exc, "errors") and callable(exc.errors):
        return f"invalid options: {describe_validation_error(exc)}"
    if kind in USER_ERROR_KINDS:
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
