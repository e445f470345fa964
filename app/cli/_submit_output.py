"""What ``autofusion submit`` shows: progress, quality gates, the summary (text, JSON and
Markdown for ``GITHUB_STEP_SUMMARY``). Reads reports defensively: a key a newer or older
server does not send is shown as missing, never a crash."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import IO, Any

__all__ = [
    "FINAL",
    "Gate",
    "Progress",
    "emit",
    "evaluate_gates",
    "facts",
    "report_speedup",
    "write_step_summary",
]

FINAL = ("succeeded", "failed", "cancelled")
_BAR = 24
# Where a report may carry the measured speedup (profiling arrives in a later issue).
_SPEEDUP_PATHS = (("speedup",), ("profile", "speedup"), ("profiling", "speedup"))


@dataclass(frozen=True)
class Gate:
    name: str
    passed: bool
    message: str


def report_speedup(report: dict) -> float | None:
    for path in _SPEEDUP_PATHS:
        value: Any = report
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return float(value)
    return None


def _max_abs_diff(check: dict | None) -> float | None:
    value = (check or {}).get("max_abs_diff")
    return float(value) if isinstance(value, int | float) else None


def evaluate_gates(
    report: dict, max_abs_diff: float | None, min_speedup: float | None
) -> list[Gate]:
    """The server's own check (when it ran), then the gates asked for on the command line."""
    gates = []
    check = report.get("check")
    diff = _max_abs_diff(check)
    if check is not None:
        if check.get("passed") and not check.get("error"):
            gates.append(Gate("check", True, "the fused model matches the original"))
        else:
            shown = f"max abs diff {diff:.3g}" if diff is not None else "no verdict"
            why = check.get("error") or shown
            gates.append(Gate("check", False, f"the fused model does not match ({why})"))
    if max_abs_diff is not None:
        if diff is None:
            gates.append(Gate("max-abs-diff", False, "the server skipped the numerical check"))
        else:
            ok = diff <= max_abs_diff
            sign = "<=" if ok else ">"
            gates.append(
                Gate("max-abs-diff", ok, f"max abs diff {diff:.3g} {sign} {max_abs_diff:g}")
            )
    if min_speedup is not None:
        speedup = report_speedup(report)
        if speedup is None:
            message = "the server did not measure speed (no speedup in the report)"
            gates.append(Gate("min-speedup", False, message))
        else:
            ok = speedup >= min_speedup
            sign = ">=" if ok else "<"
            gates.append(Gate("min-speedup", ok, f"speedup {speedup:.2f}x {sign} {min_speedup:g}x"))
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


def _fusions(report: dict) -> str:
    fusions = report.get("fusions") or {}
    if not fusions:
        return "none"
    ranked = sorted(fusions.items(), key=lambda kv: (-kv[1], kv[0]))
    return f"{sum(fusions.values())} (" + ", ".join(f"{n} {c}" for n, c in ranked) + ")"


def _check(report: dict) -> str:
    check = report.get("check")
    if check is None:
        return "skipped"
    if check.get("error"):
        return f"FAILED: {check['error']}"
    verdict = "passed" if check.get("passed") else "FAILED"
    diff = _max_abs_diff(check)
    return f"{verdict}, max abs diff {diff:.3g}" if diff is not None else verdict


def facts(outcome: Any) -> Iterator[tuple[str, str]]:
    """(label, value) pairs shared by the text summary and the Markdown one."""
    job = outcome.job
    status = job.get("status", "?")
    registry = job.get("registry_version")
    yield "job", f"{job.get('id')} {status}" + (f" (registry v{registry})" if registry else "")
    report = outcome.report
    if report is not None:
        nodes = report.get("nodes") or {}
        yield "fusions", _fusions(report)
        yield "check", _check(report)
        yield "nodes", f"{nodes.get('before', '?')} -> {nodes.get('after', '?')}"
        speedup = report_speedup(report)
        yield "speedup", f"{speedup:.2f}x" if speedup is not None else "not measured by the server"
        optimizer = sum(v for v in (report.get("timings_s") or {}).values() if v)
        elapsed = outcome.elapsed_s
        yield "time", f"{optimizer:.2f} s optimizing, {elapsed:.1f} s from upload to result"
    for gate in outcome.gates:
        yield f"gate {gate.name}", ("passed: " if gate.passed else "FAILED: ") + gate.message


def _text(outcome: Any, model: str, args: Any) -> str:
    if outcome.job.get("status") not in FINAL:
        job = outcome.job
        return f"autofusion: {model} -> job {job.get('id')} {job.get('status')}: {outcome.url}"
    lines = [f"autofusion: {model}"]
    lines += [f"  {label + ':':<20}{value}" for label, value in facts(outcome)]
    for label, path in (("wrote", args.output), ("report", args.report)):
        if path is not None and outcome.report is not None:
            lines.append(f"  {label + ':':<20}{path}")
    return "\n".join(lines)


def _json(outcome: Any) -> str:
    document = dict(outcome.report or {})
    document["job"] = outcome.job
    document["submit"] = {
        "exit_code": outcome.code,
        "message": outcome.message,
        "gates": [asdict(g) for g in outcome.gates],
        "idempotency_key": outcome.idempotency_key,
        "url": outcome.url,
    }
    return json.dumps(document, indent=2)


def emit(outcome: Any, model: str, args: Any) -> None:
    print(_json(outcome) if args.json else _text(outcome, model, args))
    if outcome.message:
        sys.stderr.write(f"autofusion submit: {outcome.message}\n")
    write_step_summary(model, outcome, outcome.message)


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
