"""Run ``autofusion optimize`` on many models in one process, output captured per call.

Starting the CLI costs seconds of imports, far more than optimizing one of the ONNX
backend test models, so the no-traceback test runs the CLI's own ``main()`` in a few
worker processes instead of one process per model. Each call's stdout and stderr are
captured at the file-descriptor level (what a terminal would show, onnxruntime's C++
log lines included), so a traceback printed anywhere is seen just as it would be in a
shell. A call that runs longer than ``--call-timeout`` is interrupted and recorded.

    python tests/corpus/cli_batch.py JOBS.jsonl RESULTS.jsonl [--call-timeout 60]

JOBS.jsonl: one ``{"id", "model", "target", "out"}`` per line; RESULTS.jsonl gets one
``{"id", "target", "rc", "seconds", "output", "failure"}`` per job (``failure``: the
report's check failure kind, when the check failed), appended as each one ends.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

OUTPUT_LIMIT = 4000


class CallTimeout(BaseException):
    """Raised by SIGALRM inside a call; a BaseException so the CLI does not catch it."""


def _alarm(signum, frame):
    raise CallTimeout


@contextlib.contextmanager
def captured_fds():
    """Redirect fds 1 and 2 into one temporary file; yields a reader for its text."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        holder: dict[str, str] = {}
        try:
            yield holder
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            sink.seek(0)
            holder["text"] = sink.read().decode("utf-8", "replace")


def run_one(job: dict, call_timeout: int) -> dict:
    from autofusion.app.cli import main

    report = Path(job["out"]).with_suffix(".json")
    argv = [
        "optimize",
        job["model"],
        "-o",
        job["out"],
        "--target",
        job["target"],
        "--report",
        str(report),
    ]
    start = time.perf_counter()
    signal.alarm(call_timeout)
    with captured_fds() as out:
        try:
            rc = main(argv)
        except CallTimeout:
            rc = "timeout"
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 2
        except BaseException:  # escaped main(): exactly what a user would see
            traceback.print_exc()
            rc = "uncaught"
        finally:
            signal.alarm(0)
    text = out["text"]
    check = json.loads(report.read_text()).get("check") or {} if report.is_file() else {}
    with contextlib.suppress(FileNotFoundError):
        report.unlink()
    return {
        "failure": check.get("failure"),
        "id": job["id"],
        "target": job["target"],
        "rc": rc,
        "seconds": round(time.perf_counter() - start, 3),
        "output": text if len(text) <= OUTPUT_LIMIT else text[:1000] + "\n...\n" + text[-3000:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("jobs", type=Path)
    parser.add_argument("results", type=Path)
    parser.add_argument("--call-timeout", type=int, default=60)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGALRM, _alarm)
    jobs = [json.loads(line) for line in args.jobs.read_text().splitlines() if line.strip()]
    with args.results.open("a") as results:
        for job in jobs:
            results.write(json.dumps(run_one(job, args.call_timeout)) + "\n")
            results.flush()
            with contextlib.suppress(FileNotFoundError):
                Path(job["out"]).unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
