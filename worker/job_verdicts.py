"""A measured job's verdicts, on the worker's side (issue 28).

Before the sandbox starts, the verdicts the job may reuse (``fresh_for``: this host's
CPU and onnxruntime, fresh, shared or the tenant's own) are written into the attempt's
folder, where ``plan.py`` pointed ``measure_options.verdicts_file``; ``run_sandbox``
gives the folder to the sandbox's user, so it can read them. Measured selection
decides what they cover without timing and writes what it measured to
``output/verdicts.json``.

Once the job has succeeded, that file is read as what it is, the output of a process
that ran a user's model: a symlink, an oversized file or a file that is not a verdicts
file is left alone (logged), invalid records are dropped (``read_verdicts``), and the
store sets who measured them (``app.services.verdicts.record_job_verdicts``). A store
that fails is logged: the job's result stands.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path
from typing import Any

from autofusion.app.core.config import Settings
from autofusion.app.core.db import session_scope
from autofusion.app.core.models import Job
from autofusion.app.services.verdicts import fresh_for, record_job_verdicts, storable
from autofusion.fusion_core.profiling.verdicts import (
    VerdictRecord,
    host_class,
    machine_key,
    measuring_machine,
    read_verdicts,
    write_verdicts,
)
from autofusion.worker.sandbox import OUTPUT_DIR, VERDICTS_FILE

__all__ = ["MAX_OUTPUT_BYTES", "JobVerdicts"]

logger = logging.getLogger(__name__)

# The sandbox's verdicts file is not read past this size: a job stores at most
# verdicts_per_job_limit records of a few kilobytes each.
MAX_OUTPUT_BYTES = 64 * 1024 * 1024


class JobVerdicts:
    """One attempt's verdicts: ``write_reusable`` before the sandbox, ``collect`` after
    it (the summary's ``verdicts.stored``), ``store`` once the job has succeeded."""

    def __init__(self, settings: Settings, job: Job, config: dict[str, Any], folder: Path):
        self.settings, self.job, self.folder = settings, job, folder
        options = config.get("measure_options") or {}
        # plan.py points a measured job (only) at the attempt folder's file.
        self.measured = options.get("verdicts_file") == str(folder / VERDICTS_FILE)
        level, threads = options.get("level"), options.get("threads")
        self.machine_key = machine_key(measuring_machine(level, threads)) if self.measured else None
        self.records: list[VerdictRecord] = []

    def write_reusable(self) -> int:
        """The verdicts this job may reuse, into its folder (an empty file when the store
        cannot be read: the job then times every group); how many."""
        if not self.measured:
            return 0
        try:
            with session_scope(self.settings.resolved_database_url) as session:
                records = fresh_for(
                    session, host_class(), tenant_id=self.job.tenant_id, settings=self.settings
                )
        except Exception:  # the job still runs: measured selection times everything
            logger.exception("job %s: could not read the verdict store", self.job.id)
            records = []
        write_verdicts(self.folder / VERDICTS_FILE, records)
        logger.info("job %s: %d verdicts handed to measured selection", self.job.id, len(records))
        return len(records)

    def collect(self, summary: dict[str, Any]) -> None:
        """Read what the sandbox measured; the summary's ``verdicts.stored`` says how
        many of them the store will take."""
        if not self.measured:
            return
        self.records = _read_output(self.folder / OUTPUT_DIR / VERDICTS_FILE, self.job.id)
        if isinstance(summary.get("verdicts"), dict):
            limit = self.settings.verdicts_per_job_limit
            kept = storable(self.job.id, self.records, self.machine_key, limit)
            summary["verdicts"]["stored"] = len(kept)

    def store(self) -> int:
        """Store what ``collect`` read (after the job's success); 0 when it failed."""
        if not self.records:
            return 0
        try:
            with session_scope(self.settings.resolved_database_url) as session:
                stored = record_job_verdicts(
                    session,
                    self.job,
                    self.records,
                    self.settings,
                    machine_key=self.machine_key,
                )
        except Exception:  # the job has succeeded: its verdicts are lost, not its result
            logger.exception("job %s: could not store its verdicts", self.job.id)
            return 0
        logger.info("job %s: %d verdicts stored", self.job.id, stored)
        return stored


def _read_output(path: Path, job_id: str) -> list[VerdictRecord]:
    """The valid records of the sandbox's verdicts file; none when it is missing, not a
    regular file (a symlink would make the worker read what it points to), too large,
    or not a verdicts file."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return []
    if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_OUTPUT_BYTES:
        logger.warning(
            "job %s: output/%s is not a regular file of at most %d bytes: its verdicts are "
            "not stored",
            job_id,
            VERDICTS_FILE,
            MAX_OUTPUT_BYTES,
        )
        return []
    try:
        records, skipped = read_verdicts(path)
    except (OSError, ValueError) as exc:
        logger.warning("job %s: its verdicts are not stored: %s", job_id, exc)
        return []
    if skipped:
        logger.warning(
            "job %s: %d invalid verdicts dropped (the first: %s)", job_id, len(skipped), skipped[0]
        )
    return records
