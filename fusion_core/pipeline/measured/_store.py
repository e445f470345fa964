"""Where measured selection finds verdicts to reuse, and the local store it adds to.

Both are files in the verdicts format (``fusion_core.profiling.verdicts``):

* ``MeasureOptions.verdicts_file``, read only: the service's worker writes the fresh
  verdicts of its database into the job's folder (a sandbox never writes a store other
  jobs read, so one job cannot poison another's decisions); a user passes an export
  with ``autofusion optimize --verdicts FILE``.
* ``MeasureOptions.cache_dir``, the local CLI's store: ``verdicts.json`` in that folder,
  read, and appended to with what this run measured. The whole file is written again
  through a temporary file renamed (a reader never sees half of it), under a lock file
  where the platform has ``fcntl`` (two jobs appending at once both keep theirs; without
  the lock one append may be lost, which costs a measurement next time, never an error).
  It keeps the records within the age limit, at most ``KEEP`` of them, the newest.

A file that cannot be read, or is not a verdicts file, and a record that is not valid,
are misses, never errors: they are counted (``unreadable``, ``skipped``) and the report
says how many. Of what is read, only records of this run's machine class
(``machine_key``) measured within ``verdict_max_age_days`` (and not dated more than
``CLOCK_SKEW`` ahead) are used, by signature.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from autofusion.fusion_core.config import MeasureOptions
from autofusion.fusion_core.profiling.verdicts import (
    VerdictRecord,
    fresh,
    read_verdicts,
    write_verdicts,
)

try:  # POSIX: appends of concurrent jobs wait for each other
    import fcntl
except ImportError:  # pragma: no cover - Windows: tmp + rename only
    fcntl = None  # type: ignore[assignment]

__all__ = ["KEEP", "STORE_FILE", "VerdictStore"]

logger = logging.getLogger(__name__)

STORE_FILE = "verdicts.json"
KEEP = 10_000  # records the local store keeps at most, the newest
_PROBLEMS = 20  # problem lines kept for the report (the counts cover all)


class VerdictStore:
    """The usable records of ``files`` and of ``folder``'s store, by signature."""

    def __init__(
        self,
        files: Sequence[str | os.PathLike] = (),
        folder: str | os.PathLike | None = None,
        *,
        machine_key: str,
        max_age_days: float,
        now: datetime | None = None,
    ) -> None:
        self.folder = Path(folder) if folder is not None else None
        self.machine_key = machine_key
        self.max_age_days = max_age_days
        self.now = now or datetime.now(UTC)
        self.read = self.skipped = self.unreadable = self.written = 0
        self.problems: list[str] = []
        self._seen: set[tuple[Any, ...]] = set()
        self._by_signature: dict[str, list[VerdictRecord]] = {}
        for path in files:
            self._load(Path(path), missing_ok=False)
        if self.folder is not None:
            self._load(self.folder / STORE_FILE, missing_ok=True)

    @classmethod
    def for_options(cls, opts: MeasureOptions, machine_key: str) -> VerdictStore:
        return cls(
            opts.verdict_files,
            opts.cache_dir,
            machine_key=machine_key,
            max_age_days=opts.verdict_max_age_days,
        )

    def records_for(self, signature: str) -> list[VerdictRecord]:
        """The usable records of ``signature``: this machine class, fresh."""
        return list(self._by_signature.get(signature, ()))

    def fresh(self, record: VerdictRecord) -> bool:
        return fresh(record.when, self.now, self.max_age_days)

    def add(self, records: Sequence[VerdictRecord]) -> int:
        """Appends ``records`` to the local store; how many were written (0: no store,
        or it could not be written, which the problems say)."""
        if self.folder is None or not records:
            return 0
        path = self.folder / STORE_FILE
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            with _locked(self.folder / f"{STORE_FILE}.lock"):
                kept = [r for r in _readable(path) if self.fresh(r)]
                kept = sorted([*kept, *records], key=lambda r: r.when)[-KEEP:]
                write_verdicts(path, kept)
        except OSError as exc:
            self._problem(f"the local verdict store {path} could not be written: {exc}")
            return 0
        self.written += len(records)
        return len(records)

    def _load(self, path: Path, *, missing_ok: bool) -> None:
        try:
            records, skipped = read_verdicts(path)
        except FileNotFoundError:
            if not missing_ok:
                self.unreadable += 1
                self._problem(f"{path}: no such file")
            return
        except (OSError, ValueError, RecursionError) as exc:
            self.unreadable += 1
            self._problem(f"{path}: {exc}")
            return
        self.read += len(records)
        self.skipped += len(skipped)
        for line in skipped:
            self._problem(f"{path}: {line}")
        for record in records:
            self._keep(record)

    def _keep(self, record: VerdictRecord) -> None:
        if record.machine_key != self.machine_key or not self.fresh(record):
            return
        # the same record from two files (an export of the local store passed again)
        # is one measurement, not two
        key = (record.signature, record.measured_at, record.job_id, record.ratio)
        if key not in self._seen:
            self._seen.add(key)
            self._by_signature.setdefault(record.signature, []).append(record)

    def _problem(self, line: str) -> None:
        logger.warning("verdict store: %s", line)
        if len(self.problems) < _PROBLEMS:
            self.problems.append(line)

    def summary(self, *, matched: int, measured: int) -> dict[str, Any]:
        """The report's ``measurement.store``."""
        return {
            "read": self.read,
            "skipped": self.skipped,
            "unreadable": self.unreadable,
            "matched": matched,
            "measured": measured,
            "written": self.written,
            "problems": list(self.problems),
        }


def _readable(path: Path) -> list[VerdictRecord]:
    """The valid records of the local store as it is now; none when it is unreadable
    (it is written again whole, without what could not be read)."""
    try:
        return read_verdicts(path)[0]
    except (OSError, ValueError, RecursionError):
        return []


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[None]:
    if fcntl is None:  # pragma: no cover
        yield
        return
    with open(lock_path, "a", encoding="utf-8") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)
