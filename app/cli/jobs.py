"""`autofusion jobs`: follow jobs on an autofusion server from the command line.

  autofusion jobs list [--status S] [--all]      this tenant's jobs, newest first
  autofusion jobs status ID                      one job: status, stage, progress, error
  autofusion jobs wait ID [--timeout S]          until it ends; exits with its outcome
  autofusion jobs cancel ID                      ask it to stop
  autofusion jobs delete ID                      delete an ended (or queued) job and its files
  autofusion jobs download ID [-o FILE]          the fused model
  autofusion jobs report ID [--format F] [-o F]  the report: json, html or markdown

--server and --api-key come from AUTOFUSION_SERVER and AUTOFUSION_API_KEY by default, as
for `submit`. `status` exits 0 whatever the job's state (it answered); `wait` exits with
the job's outcome (0 succeeded, 1 its check failed, 4 failed or cancelled, ...).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from autofusion.app.cli import _submit_output as output
from autofusion.app.cli._client import (
    FINAL,
    Client,
    ClientError,
    add_server_options,
    follow,
    read_json,
    with_client,
)
from autofusion.app.cli._exit import EXIT_OK, EXIT_TIMEOUT, EXIT_USAGE, epilog

__all__ = ["add_parser", "job_lines", "pages"]

STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
# GET /v1/jobs/ID/artifacts/NAME for the renderings; json is GET /v1/jobs/ID/report.
REPORT_FORMATS = {"json": None, "html": "report.html", "markdown": "report.md"}


def add_parser(commands: argparse._SubParsersAction) -> None:
    p = commands.add_parser(
        "jobs",
        description=__doc__,
        epilog=epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = p.add_subparsers(dest="jobs_command", required=True, metavar="ACTION")
    listing = _action(actions, "list", "this tenant's jobs, newest first", _run_list)
    listing.add_argument("--status", choices=STATUSES, help="only jobs in this status")
    listing.add_argument("--limit", type=int, default=20, help="jobs per page (default 20)")
    listing.add_argument("--all", action="store_true", help="every page, not only the first")
    status = _action(actions, "status", "one job's status, stage, progress and error", _run_status)
    status.add_argument("job_id", metavar="ID")
    wait = _action(actions, "wait", "wait for a job to end; exit with its outcome", _run_wait)
    wait.add_argument("job_id", metavar="ID")
    wait.add_argument(
        "--timeout", type=float, default=3600.0, metavar="SECONDS",
        help=f"give up after this long, exit {EXIT_TIMEOUT} (default 3600; the job goes on)",
    )  # fmt: skip
    cancel = _action(actions, "cancel", "ask a job to stop", _run_cancel)
    cancel.add_argument("job_id", metavar="ID")
    remove = _action(
        actions, "delete", "delete a job that is not running, and its files", _run_delete
    )
    remove.add_argument("job_id", metavar="ID")
    download = _action(actions, "download", "download a succeeded job's fused model", _run_download)
    download.add_argument("job_id", metavar="ID")
    download.add_argument("-o", "--output", type=Path, help="default: MODEL.fused.onnx here")
    report = _action(actions, "report", "a finished job's report", _run_report)
    report.add_argument("job_id", metavar="ID")
    report.add_argument("--format", choices=tuple(REPORT_FORMATS), default="json")
    report.add_argument("-o", "--output", type=Path, help="write it here (default: stdout)")


def _action(actions: argparse._SubParsersAction, name: str, help_line: str, run: Any):
    action = actions.add_parser(name, help=help_line, description=help_line)
    add_server_options(action)
    if name in ("list", "status", "wait"):
        action.add_argument("--json", action="store_true", help="print the job(s) as JSON")
    action.set_defaults(run=lambda args: with_client(args, "jobs", lambda c: run(c, args)))
    return action


def _job_url(job_id: str) -> str:
    if not job_id or "/" in job_id:
        raise ClientError(f"not a job id: {job_id!r}", EXIT_USAGE)
    return f"/v1/jobs/{job_id}"


def pages(client: Client, params: dict[str, Any], every: bool) -> Iterator[dict]:
    """The jobs, page by page: by the server's ``next_page_token`` when it sends one,
    else by offset (servers before page tokens)."""
    params = {k: v for k, v in params.items() if v is not None}
    offset = 0
    while True:
        page = read_json(client.send("GET", "/v1/jobs", params=params))
        items = page.get("items") or []
        yield from items
        token = page.get("next_page_token")
        offset += len(items)
        if not every or not items:
            return
        if token:
            params["page_token"] = token
        elif "next_page_token" not in page and offset < int(page.get("total") or 0):
            params["offset"] = offset
        else:
            return


def _run_list(client: Client, args: argparse.Namespace) -> int:
    if args.limit < 1:
        raise ClientError(f"--limit must be 1 or more, not {args.limit}", EXIT_USAGE)
    params = {"status": args.status, "limit": args.limit, "page_size": args.limit}
    jobs = list(pages(client, params, args.all))
    if args.json:
        print(json.dumps(jobs, indent=2))
        return EXIT_OK
    print(f"{'id':<36} {'status':<10} {'progress':<22} {'created':<20} model")
    for job in jobs:
        where = f"{job.get('stage') or ''} {float(job.get('progress') or 0):.0%}".strip()
        created = str(job.get("created_at") or "")[:19].replace("T", " ")
        line = f"{job.get('id', '?'):<36} {job.get('status', '?'):<10} {where:<22} {created:<20}"
        print(f"{line} {job.get('model_name', '')}")
    if not jobs:
        sys.stderr.write(
            "autofusion jobs: no jobs" + (f" {args.status}" if args.status else "") + "\n"
        )
    return EXIT_OK


def job_lines(job: dict, server: str) -> list[str]:
    """A job in words, one fact a line."""
    progress = f"{float(job.get('progress') or 0):.0%}"
    facts = [
        ("job", f"{job.get('id')} {job.get('status')}"),
        ("stage", f"{job.get('stage') or '-'} ({progress})"),
        ("model", str(job.get("model_name") or "?")),
        ("created", str(job.get("created_at") or "?")),
    ]
    if job.get("finished_at"):
        facts.append(("finished", str(job["finished_at"])))
    if job.get("status") in ("failed", "cancelled"):
        problem, reason = output.job_failure(job)
        facts.append(("error", f"{problem}: {reason}" if problem else reason))
    facts.append(("job page", f"{server}/ui/jobs/{job.get('id')}"))
    return [f"  {label + ':':<12}{value}" for label, value in facts]


def _show(job: dict, client: Client, as_json: bool) -> None:
    print(json.dumps(job, indent=2) if as_json else "\n".join(job_lines(job, client.server)))


def _run_status(client: Client, args: argparse.Namespace) -> int:
    _show(read_json(client.send("GET", _job_url(args.job_id))), client, args.json)
    return EXIT_OK


def _run_wait(client: Client, args: argparse.Namespace) -> int:
    url = _job_url(args.job_id)
    response = client.send("GET", url)
    job = read_json(response)
    progress = output.Progress(sys.stderr)
    try:
        job = follow(client, url, job, 1.0, args.timeout, progress)
    finally:
        progress.close()
    _show(job, client, args.json)
    return output.job_exit_code(job)


def _run_cancel(client: Client, args: argparse.Namespace) -> int:
    job = read_json(client.send("POST", f"{_job_url(args.job_id)}/cancel"))
    print("\n".join(job_lines(job, client.server)))
    if job.get("status") not in FINAL:
        sys.stderr.write(
            f"autofusion jobs: cancel asked; the job stops at its next step "
            f"(autofusion jobs wait {job.get('id')} follows it)\n"
        )
    return EXIT_OK


def _run_delete(client: Client, args: argparse.Namespace) -> int:
    # A running job answers 409 (exit 7): cancel it, wait for it, then delete it.
    client.send("DELETE", _job_url(args.job_id))
    sys.stderr.write(
        f"autofusion jobs: deleted job {args.job_id}; its files no longer count towards "
        "this tenant's stored bytes\n"
    )
    return EXIT_OK


def _run_download(client: Client, args: argparse.Namespace) -> int:
    url = _job_url(args.job_id)
    job = read_json(client.send("GET", url))
    if job.get("status") != "succeeded":
        raise ClientError(
            f"job {job.get('id')} is {job.get('status')}: only a succeeded job has a fused "
            "model (autofusion jobs wait ID waits for it)",
            EXIT_USAGE,
        )
    stem = Path(str(job.get("model_name") or job["id"])).name.removesuffix(".onnx")
    destination = args.output or Path(f"{stem}.fused.onnx")
    model_url = (job.get("links") or {}).get("model") or f"{url}/model"
    for path in client.download_model(job, model_url, destination):  # and its data files
        sys.stderr.write(f"autofusion jobs: wrote {path}\n")
    return EXIT_OK


def _run_report(client: Client, args: argparse.Namespace) -> int:
    url = _job_url(args.job_id)
    artifact = REPORT_FORMATS[args.format]
    path = f"{url}/artifacts/{artifact}" if artifact else f"{url}/report"
    if args.output:
        client.download(path, args.output)
        sys.stderr.write(f"autofusion jobs: wrote {args.output}\n")
        return EXIT_OK
    response = client.send("GET", path)
    sys.stdout.write(response.text if response.text.endswith("\n") else response.text + "\n")
    return EXIT_OK
