"""Sweeping the scratch folders a killed process left behind.

A worker's attempt folders (``data_dir/jobs/<job>/attempt-N``), the API's upload folders
(``data_dir/uploads/<id>``) and its download copies (``data_dir/downloads``) are removed
by the process that made them when it finishes; one killed meanwhile (``kill -9``, out
of memory, a power cut) leaves them on disk for ever. The sweepers remove them.

How a folder is judged:

- Its *age* is the time since anything in it last changed: the newest modification time
  of the folder and everything under it. A live attempt's child writes its log and
  outputs; a live upload writes its body (a slow client is cut off after
  ``body_idle_timeout_s``, far below the age limit).
- An attempt folder has an *owner file* (``write_owner``): the pid, the host and the
  process's start time (the pid alone could be a new process that reused it). It is
  removed once it is older than ``scratch_max_age_s`` *and* its owner is gone. An owner
  on another host (a shared data_dir) cannot be asked: then age alone decides, which is
  safe while the age limit exceeds the job time limit (a live attempt writes at least
  that often, or is killed).
- Upload folders are *held* by the request that streams, checks and stores them
  (``hold``/``claim``, released by ``uploads.remove_folder``): a held folder is never
  swept by this process, however old, so a big upload whose check or store outlasts
  the age is safe. Otherwise (another process, or one killed) age alone decides: an API
  process has no lease or owner row to consult, and an upload that has not moved for
  ``scratch_max_age_s`` is dead whoever owns it. The model child's folders there live
  at most ``api_sandbox_time_limit_s``. A download copy is read, not written, while it
  streams; removing it then is harmless (the open file stays readable).
- The local artifact store's temporary files (``tempfile``'s ``tmp*`` names beside the
  blobs, whose names are sha256 digests) are half-copied blobs of a process killed
  mid-``put``; age alone decides (a copy in progress keeps writing).

``ScratchSweeper`` runs the API process's sweep (``sweep_api_scratch``) when the app
starts and every ``scratch_sweep_interval_s``, in embedded and distributed mode alike;
a worker's reaper sweeps its attempt folders (``sweep_worker_scratch``).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = [
    "OWNER_FILE",
    "PeriodicThread",
    "ScratchSweeper",
    "claim",
    "folder_age_s",
    "held",
    "hold",
    "owner_alive",
    "release",
    "sweep_api_scratch",
    "sweep_artifact_temporaries",
    "sweep_folders",
    "sweep_worker_scratch",
    "write_owner",
]

logger = logging.getLogger(__name__)

OWNER_FILE = ".owner.json"


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (Linux); None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:  # the command name (field 2) may hold spaces and parentheses: split after it
        return int(stat.rpartition(")")[2].split()[19])
    except (IndexError, ValueError):
        return None


def write_owner(folder: Path) -> None:
    """Record this process as the owner of ``folder`` (which must exist)."""
    pid = os.getpid()
    owner = {"pid": pid, "host": socket.gethostname(), "started": _start_time(pid)}
    (folder / OWNER_FILE).write_text(json.dumps(owner), encoding="utf-8")


def _read_owner(folder: Path) -> dict[str, Any] | None:
    try:
        owner = json.loads((folder / OWNER_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def owner_alive(owner: dict[str, Any]) -> bool | None:
    """True: the owning process still runs; False: it is gone; None: it cannot be told
    (another host)."""
    if owner.get("host") != socket.gethostname():
        return None
    pid = owner["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        pass
    started = owner.get("started")
    return started is None or _start_time(pid) in (None, started)


def folder_age_s(path: Path, now: float | None = None) -> float:
    """Seconds since anything under ``path`` (itself included) last changed."""
    now = time.time() if now is None else now
    newest = 0.0
    try:
        newest = path.lstat().st_mtime
        if path.is_dir() and not path.is_symlink():
            for root, dirs, files in os.walk(path):
                for name in dirs + files:
                    try:
                        newest = max(newest, os.lstat(os.path.join(root, name)).st_mtime)
                    except OSError:  # removed meanwhile
                        continue
    except OSError:
        return 0.0  # gone or unreadable: not ours to judge now
    return max(0.0, now - newest)


# The scratch paths this process's requests are using now (resolved): never swept here.
_held: Counter[Path] = Counter()
_held_lock = threading.Lock()


def claim(path: Path) -> None:
    """``path`` is in use by this process until ``release(path)``."""
    with _held_lock:
        _held[path.resolve()] += 1


def release(path: Path) -> None:
    key = path.resolve()
    with _held_lock:
        _held[key] -= 1
        if _held[key] <= 0:
            del _held[key]


@contextmanager
def hold(path: Path) -> Iterator[None]:
    claim(path)
    try:
        yield
    finally:
        release(path)


def held(path: Path) -> bool:
    """Whether a request of this process holds ``path``, a folder inside it or around it."""
    key = path.resolve()
    with _held_lock:
        # A claim whose folder is gone (its holder removed it some other way) lapses.
        for gone in [p for p in _held if not p.exists()]:
            del _held[gone]
        return any(p == key or key in p.parents or p in key.parents for p in _held)


def _stale(path: Path, max_age_s: float, now: float, *, owned: bool) -> bool:
    if held(path) or folder_age_s(path, now) <= max_age_s:
        return False
    if not owned:
        return True
    owner = _read_owner(path)
    return owner is None or owner_alive(owner) is not True


def _remove(path: Path) -> bool:
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink()
    except FileNotFoundError:
        return False  # its owner finished meanwhile
    except OSError as exc:
        logger.warning("sweep: could not remove %s: %s", path, exc)
        return False
    return True


def sweep_folders(
    entries: Iterable[Path], max_age_s: float, *, owned: bool, now: float | None = None
) -> list[Path]:
    """Remove those of ``entries`` that are stale; returns what was removed. ``owned``:
    the entries carry owner files (``write_owner``) and are kept while their owner runs."""
    now = time.time() if now is None else now
    removed = [p for p in entries if _stale(p, max_age_s, now, owned=owned) and _remove(p)]
    for path in removed:
        logger.info("sweep: removed %s, left behind by a process that is gone", path)
    return removed


def _children(folder: Path) -> list[Path]:
    try:
        return sorted(folder.iterdir())
    except OSError:  # not made yet
        return []


def sweep_worker_scratch(settings: Any, now: float | None = None) -> list[Path]:
    """The attempt folders under ``settings.jobs_dir`` whose worker is gone, then the job
    folders left empty. ``settings``: app.core.config.Settings."""
    max_age = settings.scratch_max_age_s
    removed: list[Path] = []
    for job_folder in _children(settings.jobs_dir):
        attempts = [p for p in _children(job_folder) if p.is_dir()]
        swept = sweep_folders(attempts, max_age, owned=True, now=now)
        removed += swept
        # Emptied now (which made it look fresh), or empty for long: the job's own
        # attempt removes it when it ends (worker/execute.py), a killed one does not.
        if not _children(job_folder) and (swept or folder_age_s(job_folder, now) > max_age):
            try:
                job_folder.rmdir()
            except OSError:  # an attempt started in it meanwhile
                continue
            removed.append(job_folder)
    return removed


def sweep_api_scratch(settings: Any, now: float | None = None) -> list[Path]:
    """Upload folders and download copies untouched for ``scratch_max_age_s`` that no
    request of this process holds, and the local artifact store's stale temporary files
    (see the module docstring)."""
    entries = _children(settings.uploads_dir) + _children(settings.data_dir / "downloads")
    removed = sweep_folders(entries, settings.scratch_max_age_s, owned=False, now=now)
    if settings.artifact_store == "local":
        removed += sweep_artifact_temporaries(
            settings.artifacts_dir, settings.scratch_max_age_s, now
        )
    return removed


_DIGEST = re.compile(r"[0-9a-f]{64}")


def _artifact_temporaries(root: Path) -> list[Path]:
    """``tempfile``'s files in the store's folder and its ``xx/`` folders: a file whose
    name is not a digest and starts with ``tmp`` (a blob's name is its sha256)."""
    found: list[Path] = []
    for folder in [root, *(p for p in _children(root) if p.is_dir() and len(p.name) == 2)]:
        found += [
            entry
            for entry in _children(folder)
            if entry.name.startswith("tmp")
            and not _DIGEST.fullmatch(entry.name)
            and entry.is_file()
            and not entry.is_symlink()
        ]
    return found


def sweep_artifact_temporaries(
    root: Path, max_age_s: float, now: float | None = None
) -> list[Path]:
    """The half-written blobs a process killed mid-``put`` left in a local store."""
    return sweep_folders(_artifact_temporaries(root), max_age_s, owned=False, now=now)


class PeriodicThread:
    """``turn()`` in a daemon thread, then every ``interval_s`` until ``stop()``; a turn
    that raises is logged and the next one comes as usual."""

    def __init__(self, turn: Callable[[], object], interval_s: float, name: str) -> None:
        self.turn, self.interval_s, self.name = turn, interval_s, name
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the thread; a second call (a consumer that reconnected) does nothing."""
        if self.running:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.turn()
            except Exception:  # the database or a disk blinked: try again next time
                logger.exception("%s: a periodic pass failed", self.name)
            self._stop.wait(self.interval_s)


class ScratchSweeper:
    """Runs ``sweep`` now and every ``interval_s`` after: ``run_due()`` is one turn (tests
    drive it with their own ``clock``), ``start()`` runs the turns in a thread."""

    def __init__(
        self,
        sweep: Callable[[], list[Path]],
        interval_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sweep, self.interval_s, self.clock = sweep, interval_s, clock
        self.last_run: float | None = None
        self._thread = PeriodicThread(self.run_due, interval_s, "autofusion-sweeper")

    @classmethod
    def for_api(cls, settings: Any) -> ScratchSweeper:
        return cls(lambda: sweep_api_scratch(settings), settings.scratch_sweep_interval_s)

    def run_due(self) -> list[Path] | None:
        """Sweep if the interval has passed since the last sweep (or none ran yet):
        what was removed, or None when it was not due."""
        now = self.clock()
        if self.last_run is not None and now - self.last_run < self.interval_s:
            return None
        self.last_run = now
        try:
            return self.sweep()
        except Exception:  # a disk problem must not stop the sweeps to come
            logger.exception("scratch sweep failed")
            return []

    @property
    def running(self) -> bool:
        return self._thread.running

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        self._thread.stop(timeout)
