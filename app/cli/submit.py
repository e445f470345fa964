"""`autofusion submit`: the CI client. Upload a model, follow the job, gate on the result.

The upload carries an `Idempotency-Key` derived from the sha256 of the model, the data
files and the config, and of the server's version, registry snapshot and strategy
version (``_reuse``), so a retried CI step gets the job the first try created instead
of a second one, and a changed registry or server makes a new one. A data file over
64 MiB goes first through `/v1/uploads`, in chunks that resume after a broken
connection; the upload then names it. Progress goes to stderr (a bar on a terminal,
plain lines in a log), the summary or the JSON to stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from autofusion.app.cli import _submit_output as output
from autofusion.app.cli._client import (
    Client,
    ClientError,
    Upload,
    add_server_options,
    check_server,
    exit_codes,
    follow,
    read_json,
    retry_after,
)
from autofusion.app.cli._exit import (
    EXIT_BAD_INPUT,
    EXIT_GATE_FAILED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    epilog,
)
from autofusion.app.cli._extras import is_missing_dependency
from autofusion.app.cli._reuse import idempotency_key, reuse_note, server_facts
from autofusion.app.cli._submit_output import Gate, evaluate_gates, job_exit_code, job_failure
from autofusion.app.cli._upload_progress import UploadBars
from autofusion.app.client import submit_upload
from autofusion.fusion_core.errors import ConfigError
from autofusion.fusion_core.options import merge_options, read_options_file
from autofusion.fusion_core.targets import TARGET_NAMES

__all__ = [
    "Upload",
    "add_parser",
    "idempotency_key",
    "run",
]


_EPILOG = f"""\
{epilog()}

--max-abs-diff compares the report's check.max_abs_diff (the largest difference between
the original and the fused model's outputs).

--profile asks the server to measure both models in onnxruntime: the report then has
the paired speed verdict at ORT_ENABLE_ALL (fused/original run time per interleaved
iteration, its median, a 95% interval, and faster / no measurable change / slower).
--min-speedup X implies --profile and passes when the measured speedup (1 / that
median) is at least X; the message names the speedup, the verdict, the interval and
the number of runs.

--strategy takes a named strategy (see GET /v1/strategies) or a JSON/YAML file holding
config fields (target, patterns, exclude, check: {{rtol, atol, samples, ...}}).

The same model, data, config, server version, registry snapshot and strategy version
give the same Idempotency-Key: the server hands back the job they made (for up to its
idempotency_key_ttl_s) and the summary says "reused job X from <time>, ...".

With GITHUB_STEP_SUMMARY set, a Markdown summary is appended to that file; with
--github-output FILE (default: GITHUB_OUTPUT, as GitHub Actions sets it) the step's
outputs are appended there: job-id, status, exit-code, speedup, max-abs-diff, job-url,
page-url, report-url.
"""


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "submit",
        description=__doc__,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", type=Path, help="the .onnx file to optimize")
    add_server_options(p)
    p.add_argument(
        "--data", action="append", type=Path, default=[], metavar="FILE",
        help="an external-data file of the model (repeatable; one over 64 MiB goes first "
        "through /v1/uploads, in chunks that resume after a broken connection)",
    )  # fmt: skip
    p.add_argument("--strategy", metavar="NAME|FILE", help="named strategy or a config file")
    p.add_argument("--target", choices=TARGET_NAMES, help="what to emit")
    p.add_argument("--wait", action="store_true", help="wait for the job to finish")
    p.add_argument(
        "--timeout", type=_positive, default=3600.0, metavar="SECONDS",
        help=f"with --wait: give up after this long, exit {EXIT_TIMEOUT} (default 3600)",
    )  # fmt: skip
    p.add_argument(
        "--profile", action="store_true",
        help="measure the speedup on the server (onnxruntime, both models, paired runs)",
    )  # fmt: skip
    p.add_argument(
        "--measure", action="store_true",
        help="measured selection on the server's worker: keep only the fusion groups that "
        "measure faster there (docs/measured.md)",
    )  # fmt: skip
    p.add_argument(
        "--measure-budget", type=_positive, metavar="SECONDS",
        help="with --measure: seconds of timed runs (the server's default: 60)",
    )  # fmt: skip
    p.add_argument(
        "--strict", action="store_true",
        help="a failed check fails the job; by default the server falls back to the "
        "largest set of fusions that passes (docs/validation.md)",
    )  # fmt: skip
    p.add_argument(
        "--min-speedup", type=_positive, metavar="X",
        help="gate: the measured speedup >= X (implies --profile)",
    )  # fmt: skip
    p.add_argument(
        "--max-abs-diff", type=_non_negative, metavar="Y",
        help="gate: the check's max abs diff <= Y",
    )  # fmt: skip
    _add_callback_option(p)
    _add_output_options(p)
    p.add_argument(
        "--idempotency-key", metavar="KEY",
        help="override the key derived from the inputs (e.g. to force a new job)",
    )  # fmt: skip
    p.set_defaults(run=run)


def _add_output_options(p: argparse.ArgumentParser) -> None:
    """Where the result goes: files, stdout as JSON, the GitHub step outputs."""
    p.add_argument("-o", "--output", type=Path, help="with --wait: write the fused model here")
    p.add_argument("--report", type=Path, help="with --wait: write the JSON report here")
    p.add_argument(
        "--json", action="store_true",
        help="print JSON on stdout: status, verdict, speedup, fusions, gates, job id and "
        "URLs first, then details (docs/service.md, \"submit --json\")",
    )  # fmt: skip
    p.add_argument(
        "--json-full", action="store_true",
        help="--json with the whole report and job resource added (large)",
    )  # fmt: skip
    p.add_argument(
        "--github-output", type=Path, default=os.environ.get("GITHUB_OUTPUT") or None,
        metavar="FILE",
        help="append the step outputs (job-id, status, speedup, max-abs-diff...) to FILE "
        "(default: GITHUB_OUTPUT, set by GitHub Actions)",
    )  # fmt: skip


def _add_callback_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--callback-url", metavar="URL",
        help="the server POSTs the job's summary here, signed (Standard Webhooks), when "
        "the job ends; its host must be one the server allows (docs/service.md, Webhooks)",
    )  # fmt: skip


def _positive(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number above 0, not {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number, 0 or above, not {text}")
    return value


# ----- building the request -------------------------------------------------------------


def _load_strategy_file(path: Path) -> dict[str, Any]:
    read = read_options_file
    try:  # the same reader as `autofusion optimize --strategy`, which validates each field
        from autofusion.fusion_core.config import read_strategy_file as read
    except ModuleNotFoundError as exc:
        if not is_missing_dependency(exc):
            raise
        # The base install has no engine (pydantic) to check the fields with: the server
        # checks them, and refuses an invalid one as an invalid-config 422 (exit 2 too).
    try:
        return read(path)
    except ConfigError as exc:
        raise ClientError(str(exc), EXIT_USAGE) from None


def build_upload(args: argparse.Namespace) -> Upload:
    for path in [args.model, *args.data]:
        if not path.is_file():
            raise ClientError(f"no such file: {path}", EXIT_BAD_INPUT)
    from_file: dict[str, Any] = {}
    given: dict[str, Any] = {}
    if args.strategy:
        candidate = Path(args.strategy)
        if candidate.is_file():
            from_file = _load_strategy_file(candidate)
        elif candidate.suffix in (".json", ".yaml", ".yml") or os.sep in args.strategy:
            raise ClientError(f"no such strategy file: {args.strategy}", EXIT_USAGE)
        else:
            given["strategy"] = args.strategy
    if args.target:
        given["target"] = args.target
    if args.profile or args.min_speedup is not None:
        given["profile"] = True
    if args.strict:
        given["strict"] = True
    if args.callback_url:
        given["callback_url"] = args.callback_url
    if args.measure_budget is not None and not args.measure:
        raise ClientError("--measure-budget needs --measure", EXIT_USAGE)
    if args.measure:
        given["measure"] = True
        if args.measure_budget is not None:
            given["measure_options"] = {"budget_s": args.measure_budget}
    # the file's fields under the flags, merged as the worker and `optimize` merge them
    return Upload(args.model, list(args.data), merge_options(from_file, given))


def _check_usage(args: argparse.Namespace) -> None:
    check_server(args.server)
    needs_wait = [
        name
        for name, value in (
            ("-o", args.output),
            ("--report", args.report),
            ("--min-speedup", args.min_speedup),
            ("--max-abs-diff", args.max_abs_diff),
        )
        if value is not None
    ]
    if needs_wait and not args.wait:
        raise ClientError(
            f"{', '.join(needs_wait)} need(s) --wait: without it submit returns as soon as "
            "the job is queued",
            EXIT_USAGE,
        )


# ----- the command ------------------------------------------------------------------------


@dataclass
class Outcome:
    job: dict
    url: str  # the job resource
    server: str
    idempotency_key: str
    profiled: bool = False  # the job asked to be profiled
    replayed: bool = False  # the job an earlier identical request created
    reused: dict | None = None  # when replayed: what it was made with (_reuse.reuse_note)
    report: dict | None = None
    data_files: list[Path] = field(default_factory=list)  # written beside -o's model
    gates: list[Gate] = field(default_factory=list)
    elapsed_s: float = 0.0
    code: int = EXIT_OK
    message: str | None = None


def _link(job: dict, name: str, job_url: str) -> str:
    return (job.get("links") or {}).get(name) or f"{job_url}/{name}"


def _write_failed_report(client: Client, path: Path, url: str) -> None:
    """A job whose check failed keeps its report (what the check saw): write it too."""
    try:
        report = read_json(client.send("GET", url))
    except ClientError:  # the job failed before it had one
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")


def _collect(client: Client, args: argparse.Namespace, outcome: Outcome, job_url: str) -> None:
    job = outcome.job
    if job["status"] != "succeeded":
        # the problem type's slug: check-failed, model-cannot-run, crashed-twice, ...
        problem, error = job_failure(job)
        status = f"{job['status']} ({problem})" if problem else job["status"]
        outcome.code, outcome.message = job_exit_code(job), f"job {job['id']} {status}: {error}"
        if outcome.replayed:
            outcome.message += (
                " (an earlier submit of the same inputs made this job; to run them again, "
                "pass a new --idempotency-key)"
            )
        if args.report and job["status"] == "failed":
            _write_failed_report(client, args.report, _link(job, "report", job_url))
        return
    outcome.report = read_json(client.send("GET", _link(job, "report", job_url)))
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(json.dumps(outcome.report, indent=2) + "\n", encoding="utf-8")
    if args.output:  # and its data files beside it, when its weights went to one
        written = client.download_model(job, _link(job, "model", job_url), args.output)
        outcome.data_files = written[1:]
    outcome.gates = evaluate_gates(
        outcome.report, args.max_abs_diff, args.min_speedup, profiled=outcome.profiled
    )
    failed = [g for g in outcome.gates if not g.passed]
    if failed:
        outcome.code = EXIT_GATE_FAILED
        outcome.message = "quality gate failed: " + "; ".join(g.message for g in failed)


def _profiled(job: dict, upload: Upload) -> bool:
    """Whether the job measures speed: as this upload asked, or as the job says it was."""
    config = job.get("config") if isinstance(job.get("config"), dict) else {}
    return bool(upload.config.get("profile") or config.get("profile"))


def _submit(client: Client, args: argparse.Namespace, upload: Upload) -> Outcome:
    # Before the upload: what a job made now would run with, part of the key.
    strategy = upload.config.get("strategy")
    facts = server_facts(client, strategy if isinstance(strategy, str) else None)
    key = args.idempotency_key or idempotency_key(upload, facts)
    started = time.monotonic()
    response = _send(client, upload, key)
    job = read_json(response)
    location = response.headers.get("Location") or f"/v1/jobs/{job['id']}"
    job_url = httpx.URL(location).path if location.startswith("http") else location
    outcome = Outcome(job, url=client.server + job_url, server=client.server, idempotency_key=key)
    outcome.profiled = _profiled(job, upload)
    outcome.replayed = response.headers.get("Idempotent-Replayed") == "true"
    if outcome.replayed:
        outcome.reused = reuse_note(job, facts)
    if not args.wait:
        return outcome
    progress = output.Progress(sys.stderr)
    try:
        delay = retry_after(response, 1.0)
        outcome.job = follow(client, job_url, job, delay, args.timeout, progress)
    except ClientError as exc:
        if exc.code != EXIT_TIMEOUT:
            raise
        outcome.code, outcome.message = EXIT_TIMEOUT, str(exc)
        return outcome
    finally:
        progress.close()
    _collect(client, args, outcome, job_url)
    outcome.elapsed_s = time.monotonic() - started
    return outcome


def _send(client: Client, upload: Upload, key: str) -> httpx.Response:
    """The upload, its big data files first through /v1/uploads, their progress shown."""
    bars = UploadBars(sys.stderr)
    try:
        with exit_codes():
            return submit_upload(client.transport, upload, key, on_progress=bars)
    finally:
        bars.close()


def run(args: argparse.Namespace) -> int:
    try:
        _check_usage(args)
        upload = build_upload(args)
    except ClientError as exc:
        return _stop(args, exc, None)
    client = Client(args.server, args.api_key)
    try:
        outcome = _submit(client, args, upload)
    except ClientError as exc:
        return _stop(args, exc, upload.model.name)
    finally:
        client.close()
    output.emit(outcome, upload.model.name, args)
    return outcome.code


def _stop(args: argparse.Namespace, exc: ClientError, model: str | None) -> int:
    """Before a job to show: the message, the step summary and outputs, the code."""
    sys.stderr.write(f"autofusion submit: {exc}\n")
    if model is not None:
        output.write_step_summary(model, None, str(exc))
    if args.github_output is not None:
        output.write_github_output(args.github_output, output.github_outputs(None, exc.code))
    return exc.code
