"""``execute_job``: one attempt at one job, from the claim to the finished row.

No Celery here (the task in ``worker.tasks`` is a thin adapter), so tests call it
directly. The steps:

1. claim the row (compare-and-set; None means someone else has it, or it is over);
2. plan: the registry snapshot (recorded on the row), the named strategy merged into
   the config, and the config checked against the snapshot, all before any child runs;
3. fetch the model and its external data from the store into an attempt folder, and
   fail a job whose predicted peak memory cannot fit the limit (``worker.memory_plan``);
4. run ``worker.sandbox`` in a child process with time and memory limits, reporting its
   progress and renewing the lease while it runs;
5. store the fused model and the report, and finish the row; a measured job's verdicts
   go to the verdict store right after its success (``worker.job_verdicts``).

A user error (bad model, config or pattern, a failed check) fails the job at once,
with a problem type (``Job.error_type``, ``app.core.errors.JOB_PROBLEMS``). A crash
(signal, exit without a result, time or memory limit) costs an attempt: the job goes
back to queued for another worker, or fails once it has had ``max_attempts``. Each
attempt's outcome is kept in ``Job.attempt_log`` with the model's digest; a
deterministic one (the same signal, the time limit or the memory limit) seen a second
time on the same model fails the job then (``crashed-twice`` for a signal, the limit's
own type for a limit): a third try would only cost another ``job_time_limit_s`` of a
worker. A time limit reached while profiling a model that was saved and checked is no
failure: the job succeeds with that model and a report without a profile, and its
summary's ``profile_error`` says why (the speed is unknown).

The final write (result, artifacts and status, or the release of a crashed attempt) is
retried with backoff while the database is unreachable, for ``final_write_retry_s``:
a short database outage does not discard a finished attempt.
"""

from __future__ import annotations

import contextlib
import enum
import json
import logging
import os
import shutil
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from autofusion.app.core import tracing
from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.logs import bind, resolve_format, set_context
from autofusion.app.core.models import Job, JobStatus, utcnow
from autofusion.app.services.artifacts import ArtifactStore
from autofusion.app.services.db_retry import is_transient_db_error, retry_transient
from autofusion.app.services.job_claims import hold_job, is_held
from autofusion.app.services.job_files import fused_model_filename
from autofusion.app.services.job_phases import next_phases
from autofusion.app.services.jobs import (
    claim_job,
    finish_job,
    release_job,
    report_progress,
)
from autofusion.app.services.sandbox_policy import (
    isolation_request,
    job_cpu_limit_s,
    sandbox_identity,
)
from autofusion.app.services.scratch import write_owner
from autofusion.fusion_core.pipeline import PROFILE_UNFINISHED
from autofusion.fusion_core.validate import ORIGINAL_CANNOT_RUN
from autofusion.worker import sandbox
from autofusion.worker.attempts import (
    KIND_PROBLEMS,
    Crash,
    UserError,
    crashed_twice_message,
    hung_message,
    profile_unfinished_message,
    repeated_problem,
    same_crash_before,
    signal_name,
)
from autofusion.worker.job_verdicts import JobVerdicts
from autofusion.worker.memory_plan import check_memory
from autofusion.worker.plan import JobConfigError, Plan, attempt_folder, plan_job, summarize
from autofusion.worker.snapshots import SnapshotCache, default_cache
from autofusion.worker.supervise import ChildRun, run_child

__all__ = ["Outcome", "execute_job"]

logger = logging.getLogger(__name__)


class Outcome(enum.StrEnum):
    skipped = "skipped"  # not claimed: another worker has it, or it is over
    succeeded = "succeeded"
    failed = "failed"
    cancelled = "cancelled"
    requeued = "requeued"  # the attempt crashed; the job is queued again
    deferred = "deferred"  # the worker is stopping; the job is queued again
    lost = "lost"  # the lease went to another worker; nothing was written
    # Not claimed: its tenant runs max_running_jobs_per_tenant jobs; it stays queued and
    # the caller sends it again after held_job_retry_s (app/services/job_claims.py).
    held = "held"

    @property
    def needs_enqueue(self) -> bool:
        return self in (Outcome.requeued, Outcome.deferred)


def execute_job(
    settings: Settings,
    job_id: str,
    worker_id: str,
    store: ArtifactStore,
    *,
    stop: threading.Event | None = None,
    cache: SnapshotCache | None = None,
    trace: Mapping[str, str] | None = None,
) -> Outcome:
    """Run one attempt at ``job_id``; the row says what happened, the outcome repeats it.

    ``stop`` set means the worker is shutting down: the child is killed and the job
    queued again without costing an attempt. ``Outcome.needs_enqueue`` tells the
    caller to send the job id to the queue again. ``trace``: the W3C trace context the
    job's message carried; the attempt's spans join that trace (``app.core.tracing``).
    """
    if stop is not None and stop.is_set():
        return Outcome.deferred
    # Every line logged, and every span, for the job carries its ids.
    with (
        bind(job_id=job_id),
        tracing.attached(trace),
        tracing.ids(job_id=job_id),
        tracing.span("autofusion.job", kind="consumer", worker_id=worker_id),
    ):
        outcome = _execute(settings, job_id, worker_id, store, stop, cache)
        tracing.annotate(outcome=outcome.value)
        return outcome


def _execute(
    settings: Settings,
    job_id: str,
    worker_id: str,
    store: ArtifactStore,
    stop: threading.Event | None,
    cache: SnapshotCache | None,
) -> Outcome:
    claim = tracing.span("autofusion.job.claim")
    with claim, session_scope(settings.resolved_database_url) as session:
        limit = settings.max_running_jobs_per_tenant
        job = claim_job(session, job_id, worker_id, settings.lease_s, max_running=limit)
        if job is None:
            if is_held(session, job_id, max_running=limit):
                hold_job(session, job_id)
                logger.info("job %s: held, its tenant runs %d jobs already", job_id, limit)
                return Outcome.held
            logger.info("job %s: not claimed (running elsewhere, or over)", job_id)
            return Outcome.skipped
        attempt = _Attempt(settings, job, worker_id, store, stop or threading.Event())
        tracing.annotate(request_id=job.request_id, tenant=job.tenant_id)  # the claim's span
    set_context(request_id=job.request_id, job_id=job_id)  # the request that created it
    # The job's span: its request and tenant, known now.
    tracing.annotate(request_id=job.request_id, tenant=job.tenant_id, attempt=attempt.number)
    logger.info("job %s: attempt %d of %d", job_id, attempt.number, attempt.max_attempts)
    try:
        with tracing.ids(tenant=job.tenant_id):
            return attempt.run(cache or default_cache)
    finally:
        shutil.rmtree(attempt.folder, ignore_errors=True)
        with contextlib.suppress(OSError):
            attempt.folder.parent.rmdir()  # the job's folder, once no attempt is left in it


class _Attempt:
    def __init__(
        self,
        settings: Settings,
        job: Job,
        worker_id: str,
        store: ArtifactStore,
        stop: threading.Event,
    ) -> None:
        self.settings, self.worker_id, self.store, self.stop = settings, worker_id, store, stop
        self.url = settings.resolved_database_url
        self.job_id, self.number, self.max_attempts = job.id, job.attempts, job.max_attempts
        self.job = job  # detached: read-only facts (model, files, config, strategy)
        self.folder = attempt_folder(settings, job)
        self.registry_version: int | None = job.registry_version
        self.stage = "starting"  # the last stage reported: where a crash happened
        self.phases: list[dict[str, str]] = list(job.phases or [])  # claim_job began them
        self.stored: dict[str, int] = {}  # digest -> size of what this attempt stored

    @contextmanager
    def _db(self) -> Iterator[Session]:
        with session_scope(self.url) as session:
            yield session

    def run(self, cache: SnapshotCache) -> Outcome:
        try:
            with tracing.span("autofusion.job.plan"), self._db() as session:
                plan = plan_job(session, self.job, cache, settings=self.settings)
            self.registry_version = plan.snapshot.version
            self.verdicts = JobVerdicts(self.settings, self.job, plan.config, self.folder)
            if not self.report("fetching", 0.02):
                return self._abandoned()
            with tracing.span("autofusion.job.fetch"):
                self._prepare(plan)
            # a job that cannot fit the memory limit fails now, not in a dying sandbox
            inputs = self.folder / sandbox.INPUT_DIR
            check_memory(
                self.settings, plan.config, inputs, external_data=bool(self.job.data_files)
            )
            child = run_child(
                self.folder,
                time_limit_s=self.settings.job_time_limit_s,
                heartbeat_s=max(0.5, self.settings.lease_s / 3),
                report=self.report,
                should_stop=self.stop.is_set,
                identity=sandbox_identity(self.settings),
            )
            return self._after_child(child, plan)
        except UserError as exc:
            return self._finish(JobStatus.failed, error=str(exc), error_type=exc.problem)
        except JobConfigError as exc:
            return self._finish(JobStatus.failed, error=str(exc), error_type="invalid-config")
        except Crash as exc:
            return self._crashed(exc)
        except OperationalError:
            raise  # the database is gone: the lease runs out and the reaper takes over
        except Exception as exc:  # a bug here must not leave the job running for nothing
            logger.exception("job %s: the worker failed", self.job_id)
            return self._crashed(Crash(f"internal worker error ({type(exc).__name__})"))

    def report(self, stage: str, progress: float) -> bool:
        """Progress and a renewed lease; False when the job was cancelled or lost."""
        self.stage = stage
        phases = next_phases(self.phases, stage, utcnow())  # None: the same phase goes on
        try:
            with self._db() as session:
                kept = report_progress(
                    session,
                    self.job_id,
                    self.worker_id,
                    stage,
                    progress,
                    self.settings.lease_s,
                    registry_version=self.registry_version,
                    phases=phases,
                )
            self.phases = phases or self.phases
            return kept
        except Exception as exc:  # the database blinked: keep working, retry later
            if not is_transient_db_error(exc):
                raise
            logger.warning("job %s: could not report progress: %s", self.job_id, exc)
            return True

    def _prepare(self, plan: Plan) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)
        inputs = self.folder / sandbox.INPUT_DIR
        inputs.mkdir(parents=True)
        write_owner(self.folder)  # the sweeper leaves it alone while this process lives
        files = [{"name": self.job.model_name, "digest": self.job.model_digest}]
        try:
            for entry in files + list(self.job.data_files or []):
                self.store.fetch(entry["digest"], inputs / Path(entry["name"]).name)
        except Exception as exc:  # any store (local, S3) and any reason: worth a retry
            raise Crash(f"could not fetch the model from the artifact store: {exc}") from exc
        job_file = {
            "model": Path(self.job.model_name).name,
            "output": self.fused_name,
            "config": plan.config,
            "memory_limit_mb": self.settings.job_memory_limit_mb,
            "cpu_limit_s": job_cpu_limit_s(self.settings),
            **isolation_request(self.settings, file_size_limit_mb=self._file_size_limit_mb()),
            "parent_pid": os.getpid(),
            "registry_version": plan.snapshot.version,
            # The child's log lines: the worker's format, the job's ids.
            "log_format": resolve_format(self.settings.log_format, sys.stderr),
            "job_id": self.job_id,
            "request_id": self.job.request_id,
            "trace_phases": tracing.enabled(),  # worker.supervise exports them as spans
        }
        (self.folder / sandbox.JOB_FILE).write_text(json.dumps(job_file), encoding="utf-8")
        patterns = json.dumps(plan.snapshot.specs)
        (self.folder / sandbox.PATTERNS_FILE).write_text(patterns, encoding="utf-8")
        self.verdicts.write_reusable()  # plan.py points measured selection there

    def _after_child(self, child: ChildRun, plan: Plan) -> Outcome:
        if child.status == "abandoned":
            return self._abandoned()
        if child.status == "stopped":
            return self._release(error=None, count_attempt=False)
        if child.status == "timeout":
            return self._timed_out(child, plan)
        output = self.folder / sandbox.OUTPUT_DIR
        error = child.error  # output/error.json
        if error is not None:
            if error.get("kind") == "check" and (output / sandbox.REPORT_FILE).exists():
                return self._check_failed(output, plan, child, str(error.get("message", "")))
            self._raise_child_error(error, child)
        if child.returncode == 0 and (output / sandbox.REPORT_FILE).exists():
            failed = _failed_check(output / sandbox.REPORT_FILE)
            if failed is not None:  # never `succeeded` with a failed check, whatever the exit
                if not plan.config.get("keep_failed"):
                    self._drop_fused(output)
                return self._check_failed(output, plan, child, failed)
            return self._succeed(output, plan, child)
        logger.warning("job %s: sandbox output:\n%s", self.job_id, child.log_tail)
        raise self._exit_crash(child)

    def _timed_out(self, child: ChildRun, plan: Plan) -> Outcome:
        """Past the time limit: a job whose checked model was saved before profiling ran
        out of time succeeds with it (no speed, and a summary that says why); otherwise
        a hang fails the job now and a wait is a crash, typed by the phase."""
        limit = self.settings.job_time_limit_s
        output = self.folder / sandbox.OUTPUT_DIR
        if self.stage == "profiling":
            checked = _unfinished_profile(output, self.fused_name)
            if checked is not None:
                (output / sandbox.PROFILE_TRACE_FILE).unlink(missing_ok=True)  # half written
                message = profile_unfinished_message(limit, checked=checked)
                logger.warning("job %s: %s", self.job_id, message)
                return self._succeed(output, plan, child, profile_error=message)
        problem = "profile-time-limit" if self.stage == "profiling" else "time-limit"
        if child.busy:  # a hang is not a crash: it would compute the same way again
            error = hung_message(limit, child.cpu_seconds, child.seconds, self.stage)
            entry = self._attempt_entry("timeout")
            return self._finish(
                JobStatus.failed, error=error, error_type=problem, attempt_entry=entry
            )
        what = f"the optimization ran past the time limit of {limit} s"
        raise Crash(what, outcome="timeout", problem=problem)

    def _raise_child_error(self, error: dict[str, Any], child: ChildRun) -> None:
        kind, message = error.get("kind"), str(error.get("message", ""))
        if kind in sandbox.USER_ERROR_KINDS:
            # "check" without a report: the sandbox failed while writing it
            raise UserError(message, KIND_PROBLEMS.get(str(kind), "check-failed"))
        if kind == "memory":
            raise self._memory_crash()
        logger.error("job %s: internal error in the sandbox:\n%s", self.job_id, child.log_tail)
        raise UserError(f"internal error in the optimizer: {message}", "internal-error")

    def _memory_crash(self) -> Crash:
        limit = self.settings.job_memory_limit_mb
        message = f"the optimization ran out of memory (limit {limit} MB)"
        return Crash(message, outcome="memory", problem="memory-limit")

    def _exit_crash(self, child: ChildRun) -> Crash:
        code = child.returncode or 0
        if child.failure == "memory":  # its log says so: it died before writing error.json
            return self._memory_crash()
        if code < 0:
            what = f"the optimization process crashed (signal {-code}, {signal_name(-code)})"
            return Crash(what, outcome=f"signal:{-code}")
        if code == 0:
            return Crash("the optimization process exited without writing a result")
        return Crash(f"the optimization process exited with code {code} without a result")

    def _succeed(
        self, output: Path, plan: Plan, child: ChildRun, *, profile_error: str | None = None
    ) -> Outcome:
        if not self.report("storing", 0.9):
            return self._abandoned()
        with tracing.span("autofusion.job.store"):
            fused, report_digest, summary = self._store_results(output, plan, child)
        if profile_error is not None:  # the model is kept; its speed is unknown
            summary["profile_error"] = profile_error
        self.verdicts.collect(summary)  # what measured selection measured, read as untrusted
        outcome = self._finish(
            JobStatus.succeeded, summary=summary, fused_digest=fused, report_digest=report_digest
        )
        if outcome == Outcome.succeeded:  # right after the success; a failure is only logged
            self.verdicts.store()
        return outcome

    def _check_failed(self, output: Path, plan: Plan, child: ChildRun, message: str) -> Outcome:
        """The fused model failed its check: a failed job whose report says why (and whose
        fused model is stored only when the config kept it)."""
        if not self.report("storing", 0.9):
            return self._abandoned()
        with tracing.span("autofusion.job.store"):
            fused, report_digest, summary = self._store_results(output, plan, child)
        failure = (summary.get("check") or {}).get("failure")
        return self._finish(
            JobStatus.failed,
            error=message,
            error_type="model-cannot-run" if failure == ORIGINAL_CANNOT_RUN else "check-failed",
            summary=summary,
            fused_digest=fused,
            report_digest=report_digest,
        )

    def _store_results(
        self, output: Path, plan: Plan, child: ChildRun
    ) -> tuple[str | None, str, dict[str, Any]]:
        """Put the fused model (if written), report and renderings in the store."""
        fused_file = output / self.fused_name
        try:
            fused = self._put(fused_file) if fused_file.is_file() else None
            # its weights, when they went to a data file (the input had one, or past 2 GB)
            data_files = [
                {"name": p.name, "digest": self._put(p)}
                for p in sorted(output.glob(self.fused_name + ".data"))
            ]
            report_digest = self._put(output / sandbox.REPORT_FILE)
            artifacts = {
                name: self._put(output / name)
                for name in (
                    sandbox.REPORT_HTML_FILE,
                    sandbox.REPORT_MARKDOWN_FILE,
                    sandbox.PROFILE_TRACE_FILE,
                    sandbox.REGIONS_FILE,
                    sandbox.REPRODUCERS_FILE,
                )
                if (output / name).is_file()
            }
        except Exception as exc:  # worth a retry: the store may be back
            raise Crash(f"could not store the results in the artifact store: {exc}") from exc
        report = json.loads((output / sandbox.REPORT_FILE).read_text(encoding="utf-8"))
        summary = summarize(report, plan, self.number, child.seconds)
        if data_files:
            summary["fused_data_files"] = data_files
        summary["artifacts"] = artifacts  # GET /v1/jobs/{id}/artifacts/{name}
        return fused, report_digest, summary

    @property
    def fused_name(self) -> str:
        """The fused model's file in the sandbox's output, named as its download is
        (``<stem>.fused.onnx``; its data file ``<stem>.fused.onnx.data``)."""
        return fused_model_filename(self.job)

    def _drop_fused(self, output: Path) -> None:
        """A model that failed its check is not kept (unless ``keep_failed``): nor is its
        data file."""
        (output / self.fused_name).unlink(missing_ok=True)
        (output / (self.fused_name + ".data")).unlink(missing_ok=True)

    def _put(self, path: Path) -> str:
        """Store a result file; its size goes on the job's row with the outcome (what
        the tenant stores: app/services/quotas.py)."""
        digest = self.store.put_file(path)
        self.stored[digest] = path.stat().st_size
        return digest

    def _file_size_limit_mb(self) -> int:
        """The largest file the sandbox may write: the setting, and never more than the
        inputs four times over plus 1 GiB, whatever the job's config allows the fused
        model to grow to (its size cap is the job's to set; the disk is the server's)."""
        inputs = self.folder / sandbox.INPUT_DIR
        size = sum(path.stat().st_size for path in inputs.iterdir() if path.is_file())
        relative_mb = -(-(4 * size + 1024**3) // 1024**2)
        return min(self.settings.job_file_size_limit_mb, relative_mb)

    def _attempt_entry(self, outcome: str) -> dict[str, Any]:
        """This attempt's line of ``Job.attempt_log``."""
        return {
            "attempt": self.number,
            "outcome": outcome,
            "stage": self.stage,
            "model_digest": self.job.model_digest,
        }

    def _crashed(self, crash: Crash) -> Outcome:
        what = str(crash)
        logger.warning("job %s: attempt %d: %s", self.job_id, self.number, what)
        entry = self._attempt_entry(crash.outcome or "error")
        earlier = same_crash_before(self.job.attempt_log, crash.outcome, self.job.model_digest)
        if earlier is not None:
            error = crashed_twice_message(what, earlier, self.number, self.stage, crash.outcome)
            problem = repeated_problem(crash.outcome, crash.problem)
            return self._finish(
                JobStatus.failed, error=error, error_type=problem, attempt_entry=entry
            )
        if self.number >= self.max_attempts:
            tries = f"{self.number} attempt{'s' if self.number > 1 else ''}"
            error = f"{what}; gave up after {tries}"
            return self._finish(
                JobStatus.failed, error=error, error_type=crash.problem, attempt_entry=entry
            )
        error = f"attempt {self.number} of {self.max_attempts}: {what}; trying again"
        log = [*(self.job.attempt_log or []), entry]
        return self._release(
            error=error, error_type=crash.problem, count_attempt=True, attempt_log=log
        )

    def _release(
        self,
        *,
        error: str | None,
        count_attempt: bool,
        attempt_log: list[dict[str, Any]] | None = None,
        error_type: str | None = None,
    ) -> Outcome:
        def release() -> bool:
            with self._db() as session:
                return release_job(
                    session,
                    self.job_id,
                    self.worker_id,
                    error=error,
                    error_type=error_type,
                    count_attempt=count_attempt,
                    attempt_log=attempt_log,
                )

        # A try whose commit landed but whose answer was lost finds the job queued and
        # not ours: abandoned below, and the reaper sends the job again (stale queued).
        if not self._retrying(release, "release"):  # cancelled meanwhile, or no longer ours
            return self._abandoned()
        return Outcome.requeued if count_attempt else Outcome.deferred

    def _finish(self, status: JobStatus, **fields: Any) -> Outcome:
        tries = 0

        def finish() -> Outcome:
            nonlocal tries
            tries += 1
            with self._db() as session:
                done = finish_job(
                    session,
                    self.job_id,
                    self.worker_id,
                    status=status,
                    registry_version=self.registry_version,
                    stored=self.stored,
                    **fields,
                )
                final = session.get(Job, self.job_id)
                if final is None:
                    return Outcome.lost
                # An earlier try's commit may have landed with its answer lost.
                landed = tries > 1 and final.worker_id == self.worker_id and final.finished_at
                return Outcome(final.status) if done or landed else Outcome.lost

        with tracing.span("autofusion.job.finish", status=status.value):
            outcome = self._retrying(finish, f"finish ({status})")
        logger.info("job %s: %s", self.job_id, outcome)
        return outcome

    def _retrying(self, write, what: str):
        """``write()``, retried while the database is unreachable (final_write_retry_s)."""
        return retry_transient(
            write, budget_s=self.settings.final_write_retry_s, what=f"job {self.job_id}: {what}"
        )

    def _abandoned(self) -> Outcome:
        """report() said no: finish a cancelled job, or walk away from a lost one."""
        with self._db() as session:
            job = session.get(Job, self.job_id)
            cancelled = job is not None and job.cancel_requested
        if cancelled:
            return self._finish(JobStatus.cancelled)
        logger.warning("job %s: lost the lease to another worker; stopping", self.job_id)
        return Outcome.lost


def _unfinished_profile(output: Path, fused_name: str) -> bool | None:
    """Whether the sandbox was stopped while profiling a model it had saved, with the
    report it wrote before profiling (``fusion_core.run``): None when it was not (or the
    model failed its check); else whether the model was checked (False: check skipped)."""
    report_file, fused = output / sandbox.REPORT_FILE, output / fused_name
    if not (report_file.is_file() and fused.is_file()):
        return None
    try:
        report = json.loads(report_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # cut off while written: nothing vouches for the model
        return None
    profile, check = report.get("profile"), report.get("check")
    if not isinstance(profile, dict) or profile.get("error") != PROFILE_UNFINISHED:
        return None
    if isinstance(check, dict) and check.get("passed") is not True:
        return None
    return isinstance(check, dict)


def _failed_check(report_file: Path) -> str | None:
    """What the report says about a check that did not pass; None if it passed or was
    skipped. The sandbox exits with an error for a failed check; this holds whatever it
    does."""
    check = json.loads(report_file.read_text(encoding="utf-8")).get("check") or {}
    if check.get("passed") is not False:
        return None
    reason = check.get("reason") or check.get("error") or "the check failed"
    return f"{reason}; see the report"
