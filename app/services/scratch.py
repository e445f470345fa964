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
- Upload folders and download copies rely on age alone: they belong to an API process,
  which has no lease or owner row to consult, and an upload that has not moved for
  ``scratch_max_age_s`` is dead whoever owns it. A download copy is read, not written,
  while it streams; removing it then is harmless (the open file stays readable).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

__all__ = [
    "OWNER_FILE",
    "folder_age_s",
    "owner_alive",
    "sweep_api_scratch",
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


def _stale(path: Path, max_age_s: float, now: float, *, owned: bool) -> bool:
    if folder_age_s(path, now) <= max_age_s:
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
    """Upload folders and download copies untouched for ``scratch_max_age_s`` (age
    alone: see the module docstring)."""
    entries = _children(settings.uploads_dir) + _children(settings.data_dir / "downloads")
    return sweep_folders(entries, settings.scratch_max_age_s, owned=False, now=now)
