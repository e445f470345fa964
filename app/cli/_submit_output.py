"""What ``autofusion submit`` shows: progress, quality gates, the summary (text, JSON and
Markdown for ``GITHUB_STEP_SUMMARY``).

The result's facts come from ``fusion_core.report.read_report``, the one typed reader
the worker and the dashboard use too, and the job's from its documented resource
(``app.core.job_records``, read here without pydantic: the client installs without the
server): a key an older or newer server does not send is shown as missing, never a crash."""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any

from autofusion.app.cli._client import FINAL
from autofusion.app.cli._exit import EXIT_JOB_FAILED, EXIT_OK, for_job_problem
from autofusion.app.cli._submit_json import speed_dict, submit_document, urls
from autofusion.fusion_core.report import ReportSummary, Speed, read_report

__all__ = [
    "Gate",
    "Progress",
    "emit",
    "evaluate_gates",
    "facts",
    "github_outputs",
    "job_exit_code",
    "job_failure",
    "measured_line",
    "profile_error",
    "speed_dict",
    "speed_line",
    "urls",
    "write_github_output",
    "write_step_summary",
]

_BAR = 24
# fusion_core.validate's failure kinds, in words (the check reports only what it saw).
_CHECK_FAILURES = {
    "original_cannot_run": "the original model cannot run on the generated inputs "
    "(set check dims or profiles in --strategy; this says nothing about the fusion)",
    "fused_cannot_run": "the fused model fails to run in onnxruntime",
    "cannot_load": "the fused graph is invalid: onnxruntime cannot load it",
    "invalid_graph": "the fused graph is invalid",
}  # for reports from servers that did not write check.reason


def job_failure(job: Mapping[str, Any]) -> tuple[str, str]:
    """(the problem type's slug, the reason in words) of a failed job: its ``error`` as a
    problem object, or as the string and ``error_type`` that servers before it sent."""
    error = job.get("error")
    if isinstance(error, Mapping):
        kind = error.get("type")
        reason = error.get("detail") or error.get("title")
    else:
        kind, reason = job.get("error_type"), error
    return str(kind or "").rpartition("/")[2], str(reason or "no reason given")


def job_exit_code(job: Mapping[str, Any]) -> int:
    """A final job's exit code: 0 when it succeeded, else what its failure means."""
    if job.get("status") == "succeeded":
        return EXIT_OK
    if job.get("status") == "failed":
        return for_job_problem(job_failure(job)[0])
    return EXIT_JOB_FAILED


@dataclass(frozen=True)
class Gate:
    name: str
    passed: bool
    message: str


def _check_failed(summary: ReportSummary) -> str:
    if summary.check_reason and summary.check_failure != "original_cannot_run":
        return f"the check failed: {summary.check_reason}"
    words = _CHECK_FAILURES.get(summary.check_failure or "")
    if words:
        return f"the check failed: {words}"
    diff = summary.max_abs_diff
    shown = f"max abs diff {diff:.3g}" if diff is not None else "no verdict"
    return f"the fused model does not match the original ({shown})"


def _speed_gate(
    speed: Speed | None, minimum: float, profiled: bool, unfinished: str | None = None
) -> Gate:
    if speed is None:
        if unfinished:  # the model is kept, but an unknown speed passes no gate
            why = f"{unfinished}, so there is no speedup to gate on"
        elif profiled:
            why = (
                "the job was profiled but its report has no speed measurement (profiling "
                "measured nothing: the report's profile section says what it ran); "
                "there is no speedup to gate on"
            )
        else:
            why = "the job was not profiled, so there is no speedup to gate on (use --profile)"
        return Gate("min-speedup", False, why)
    ok = speed.speedup >= minimum
    sign = ">=" if ok else "<"
    message = f"measured speedup {speed.speedup:.3f}x {sign} {minimum:g}x: {speed.describe()}"
    return Gate("min-speedup", ok, message)


def evaluate_gates(
    report: Mapping[str, Any],
    max_abs_diff: float | None,
    min_speedup: float | None,
    *,
    profiled: bool = False,
) -> list[Gate]:
    """The server's own check (when it ran), then the gates asked for on the command
    line. ``profiled``: the job asked to be profiled (says why a speed is missing)."""
    summary = read_report(report)
    gates = []
    if summary.check_passed is True:
        matches = "the fused model matches the original"
        if summary.fallback_reason:  # it passes because the failing fusions were dropped
            matches += f" after falling back ({fallback_words(summary)})"
        gates.append(Gate("check", True, matches))
    elif summary.check_passed is False:
        gates.append(Gate("check", False, _check_failed(summary)))
    if max_abs_diff is not None:
        diff = summary.max_abs_diff
        if summary.check_passed is None:
            gates.append(Gate("max-abs-diff", False, "the server skipped the numerical check"))
        elif diff is None:
            why = "the check's max abs diff is not a finite number (NaN or infinity)"
            gates.append(Gate("max-abs-diff", False, why))
        else:
            ok = diff <= max_abs_diff
            sign = "<=" if ok else ">"
            gates.append(
                Gate("max-abs-diff", ok, f"max abs diff {diff:.3g} {sign} {max_abs_diff:g}")
            )
    if min_speedup is not None:
        gates.append(_speed_gate(summary.speed, min_speedup, profiled, profile_error(report)))
    return gates


class Progress:
    """A bar on a terminal; a line per status or stage change in a log."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.tty = stream.isatty()
        self.last: tuple | None = None
        self.width = 0

    def update(self, job: dict) -> None:
        status, stage = job.get("status", "?"), job.get("stage") or ""
        fraction = min(max(float(job.get("progress") or 0.0), 0.0), 1.0)
        where = status if stage in ("", status) else f"{status}: {stage}"
        if self.tty:
            filled = round(fraction * _BAR)
            line = f"\r[{'#' * filled}{'.' * (_BAR - filled)}] {fraction:4.0%}  {where}"
            self.stream.write(line.ljust(self.width))
            self.width = len(line)
        elif (status, stage) != self.last:
            self.stream.write(f"autofusion: job {job.get('id')} {where} ({fraction:.0%})\n")
        self.last = (status, stage)
        self.stream.flush()

    def close(self) -> None:
        if self.tty and self.width:
            self.stream.write("\n")
            self.stream.flush()


def _summary_numbers(job: Mapping[str, Any], key: str, kind: type) -> dict[str, Any]:
    """A name -> number mapping of the job's summary (``counts``: fusions per pattern,
    ``timings``: seconds per phase); empty when absent or not numbers of ``kind``."""
    summary = job.get("summary")
    value = summary.get(key) if isinstance(summary, Mapping) else None
    if not isinstance(value, Mapping):
        return {}
    numbers = {str(k): v for k, v in value.items() if not isinstance(v, bool)}
    if not all(isinstance(v, kind | int) for v in numbers.values()):
        return {}
    return {k: kind(v) for k, v in numbers.items()}


def _fusions(summary: ReportSummary, job: Mapping[str, Any]) -> str:
    if not summary.fusions:
        return "none"
    counts = _summary_numbers(job, "counts", int)
    if sum(counts.values()) != summary.fusions:  # another job's, or none: the total only
        return str(summary.fusions)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"{summary.fusions} (" + ", ".join(f"{n} {c}" for n, c in ranked) + ")"


def fallback_words(summary: ReportSummary) -> str:
    """What the fallback did, for one line: why the check failed, what was dropped."""
    if summary.fallback_unchanged:
        done = "no set of fusions passed: the model is as it came"
    else:
        done = f"{summary.fallback_dropped} fusion(s) dropped"
    return f"{summary.fallback_reason}; {done}"


def _check(summary: ReportSummary) -> str:
    if summary.check_passed is None:
        return "skipped"
    diff = summary.max_abs_diff
    shown = f", max abs diff {diff:.3g}" if diff is not None else ""
    if summary.check_passed and summary.fallback_reason:
        return f"passed{shown}, after falling back: {fallback_words(summary)}"
    if summary.check_passed:
        left = "; ".join(summary.check_left_out)
        return "passed" + shown + (f"; not checked at {left}" if left else "")
    words = _CHECK_FAILURES.get(summary.check_failure or "")
    return f"FAILED: {words}" if words else "FAILED: the outputs differ" + shown


def profile_error(report: Mapping[str, Any] | None) -> str | None:
    """Why the report has no profile although profiling ran: it did not finish (the job's
    time limit; the worker kept the checked model)."""
    profile = (report or {}).get("profile")
    error = profile.get("error") if isinstance(profile, Mapping) else None
    return error if isinstance(error, str) else None


def measured_line(report: Mapping[str, Any]) -> str | None:
    """Measured selection in one line: how many groups it kept, and how many it decided
    from the verdict store (with the jobs that measured them) rather than timing them."""
    record = report.get("measurement")
    if not isinstance(record, Mapping) or not isinstance(record.get("groups"), list):
        return None
    groups = [g for g in record["groups"] if isinstance(g, Mapping)]
    kept = sum(1 for g in groups if g.get("kept") is True)
    sources = [g.get("source") for g in groups]
    line = f"{len(groups)} group(s), {kept} kept"
    if "store" in sources or "measured" in sources:
        line += (
            f"; {sources.count('store')} decided from the verdict store, "
            f"{sources.count('measured')} timed"
        )
    jobs = {
        job
        for g in groups
        if g.get("source") == "store" and isinstance(g.get("combined"), Mapping)
        for job in g["combined"].get("jobs") or []
        if isinstance(job, str)
    }
    if jobs:
        line += f" (measured by job(s) {', '.join(sorted(j[:8] for j in jobs))})"
    seconds = record.get("seconds")
    if isinstance(seconds, int | float) and not isinstance(seconds, bool):
        line += f", in {seconds:.1f} s"
    return line


def speed_line(speed: Speed | None, profiled: bool, unfinished: str | None = None) -> str:
    """The speedup and the verdict in one line, or why there is none."""
    if speed is None:
        if unfinished:
            return f"UNKNOWN: {unfinished}"
        if profiled:
            return "not measured: the job was profiled but its report has no speed"
        return "not measured: the job was not profiled (--profile measures it)"
    if speed.verdict == "slower":
        return f"SLOWER: {speed.describe()}"
    return speed.describe()


def _bytes(value: int | None) -> str:
    if value is None:
        return "?"
    for unit, size in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def _before_after(before: int | None, after: int | None) -> str | None:
    if before is None and after is None:
        return None
    return f"{_bytes(before)} -> {_bytes(after)}"


def _time(job: Mapping[str, Any], elapsed: float) -> str:
    timings = _summary_numbers(job, "timings", float)
    phases = sum(v for k, v in timings.items() if k != "sandbox" and v > 0)
    waited = f"{elapsed:.1f} s from upload to result"
    return f"{phases:.2f} s optimizing, {waited}" if phases else waited


def facts(outcome: Any) -> Iterator[tuple[str, str]]:
    """(label, value) pairs shared by the text summary and the Markdown one."""
    job = outcome.job
    status = job.get("status", "?")
    registry = job.get("registry_version")
    yield "job", f"{job.get('id')} {status}" + (f" (registry v{registry})" if registry else "")
    if getattr(outcome, "reused", None):
        yield "reused", outcome.reused["message"]
    where = urls(outcome)
    yield "job page", where["page"]
    if outcome.report is not None:
        summary = read_report(outcome.report)
        yield "fusions", _fusions(summary, job)
        yield "check", _check(summary)
        if summary.rejected:
            yield (
                "bugs",
                (
                    f"{summary.rejected} step(s) taken back as bugs of autofusion (the report's "
                    "'rejected'; please report them)"
                ),
            )
        before, after = summary.nodes_before, summary.nodes_after
        nodes = f"{'?' if before is None else before} -> {'?' if after is None else after}"
        bodies = summary.subgraph_nodes  # apart from the main graph's headline
        yield "nodes", f"{nodes} (and {bodies})" if bodies else nodes
        unfinished = profile_error(outcome.report)
        yield "speedup", speed_line(summary.speed, outcome.profiled, unfinished)
        measured = measured_line(outcome.report)
        if measured:
            yield "measured", measured
        warning = (job.get("summary") or {}).get("profile_error")
        if unfinished and isinstance(warning, str):  # the server's words: limit, what to do
            yield "warning", warning
        size = _before_after(summary.size_before_bytes, summary.size_after_bytes)
        if size:
            yield "file size", size
        memory = _before_after(summary.peak_memory_before_bytes, summary.peak_memory_after_bytes)
        if memory:
            yield "peak memory", memory
        yield "time", _time(job, outcome.elapsed_s)
    if "report" in where:
        yield "report", where["report"]
    if "report_page" in where:
        yield "report page", where["report_page"]
    for gate in outcome.gates:
        yield f"gate {gate.name}", ("passed: " if gate.passed else "FAILED: ") + gate.message


def _text(outcome: Any, model: str, args: Any) -> str:
    if outcome.job.get("status") not in FINAL:
        job = outcome.job
        queued = f"autofusion: {model} -> job {job.get('id')} {job.get('status')}: {outcome.url}"
        reused = getattr(outcome, "reused", None)
        return queued + (f"\n  ({reused['message']})" if reused else "")
    lines = [f"autofusion: {model}"]
    lines += [f"  {label + ':':<20}{value}" for label, value in facts(outcome)]
    data_files = getattr(outcome, "data_files", ())  # the model's, written beside it
    written = (("wrote", args.output), *(("its data", path) for path in data_files))
    for label, path in (*written, ("report", args.report)):
        if path is not None and outcome.report is not None:
            lines.append(f"  {label + ':':<20}{path}")
    return "\n".join(lines)


def emit(outcome: Any, model: str, args: Any) -> None:
    full = getattr(args, "json_full", False)
    if args.json or full:
        print(json.dumps(submit_document(outcome, full=full), indent=2))
    else:
        print(_text(outcome, model, args))
    if outcome.message:
        sys.stderr.write(f"autofusion submit: {outcome.message}\n")
    write_step_summary(model, outcome, outcome.message)
    if args.github_output is not None:
        write_github_output(args.github_output, github_outputs(outcome, outcome.code))


_CHECK_WORDS = {True: "passed", False: "failed", None: ""}


def github_outputs(outcome: Any | None, code: int) -> dict[str, str]:
    """The step outputs of action.yml: what a later step reads as ``steps.ID.outputs.X``.
    A value the job does not have (no speed measured, no check run) is empty."""
    job = outcome.job if outcome is not None else {}
    summary = read_report(outcome.report) if outcome and outcome.report is not None else None
    speed = summary.speed if summary else None
    diff = summary.max_abs_diff if summary else None
    return {
        "job-id": str(job.get("id") or ""),
        "status": str(job.get("status") or ""),
        "exit-code": str(code),
        "speedup": f"{speed.speedup:.4g}" if speed and math.isfinite(speed.speedup) else "",
        "max-abs-diff": f"{diff:.6g}" if diff is not None else "",
        "check": _CHECK_WORDS[summary.check_passed if summary else None],
        # the fusions a fallback dropped after a failed check; empty when it did not
        "fallback-dropped": (
            str(summary.fallback_dropped) if summary and summary.fallback_reason else ""
        ),
        "job-url": outcome.url if outcome is not None else "",
        "page-url": urls(outcome)["page"] if outcome is not None else "",
        # the report page: the dashboard's, which opens in the browser (the API's
        # report.html is a download); empty before the job has a report
        "report-url": urls(outcome).get("report_page", "") if outcome is not None else "",
    }


def write_github_output(path: Any, values: Mapping[str, str]) -> None:
    """Append ``name=value`` lines (GitHub's step output file format; the values here
    are single-line, and a newline in one would be refused rather than break the file)."""
    try:
        with open(path, "a", encoding="utf-8") as f:
            for name, value in values.items():
                if "\n" in value or "\r" in value:
                    raise ValueError(f"output {name} spans lines")
                f.write(f"{name}={value}\n")
    except OSError as exc:
        sys.stderr.write(f"autofusion submit: cannot write the step outputs to {path}: {exc}\n")


def _markdown(model: str, outcome: Any | None, message: str | None) -> str:
    verdict = "passed" if outcome is not None and outcome.code == 0 else "FAILED"
    if outcome is not None and outcome.job.get("status") not in FINAL:
        verdict = outcome.job.get("status", "submitted")
    lines = [f"### autofusion: `{model}` {verdict}", ""]
    if message:
        lines += [f"> {message}", ""]
    rows = list(facts(outcome)) if outcome is not None else []
    if rows:
        lines += ["| | |", "| --- | --- |"]
        lines += [f"| {label} | {value.replace('|', '/')} |" for label, value in rows]
        lines.append("")
    return "\n".join(lines) + "\n"


def write_step_summary(model: str, outcome: Any | None, message: str | None) -> None:
    """Append to ``$GITHUB_STEP_SUMMARY`` when it is set (GitHub Actions)."""
    path = os.environ.get("GITHUB_STEP_SUMMARY")
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as f:
            f.write(_markdown(model, outcome, message))
    except OSError as exc:
        sys.stderr.write(f"autofusion submit: cannot write GITHUB_STEP_SUMMARY ({path}): {exc}\n")
