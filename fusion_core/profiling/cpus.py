"""How many CPUs this process may use: what timings and time limits should count.

``os.cpu_count()`` is the host's count. In a container limited with ``--cpus`` (a CPU
quota of its cgroup) or pinned with ``--cpuset-cpus`` (its affinity) the process gets
fewer, and a timing measured there does not transfer to the host's other containers: the
machine class of a verdict (``verdicts.host_class``) and a sandbox's CPU-seconds budget
(the service's ``job_cpu_limit_s``) count what the process may use. Python 3.13's
``os.process_cpu_count`` reads the affinity only; the quota is read here, from cgroup v2's
``cpu.max`` or v1's ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, of the process's own
cgroup and each above it (the lowest limit binds), rounded up to whole CPUs.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["usable_cpus"]

_CGROUP_ROOT = Path("/sys/fs/cgroup")
_OWN_CGROUP = Path("/proc/self/cgroup")


def usable_cpus(root: Path = _CGROUP_ROOT, own: Path = _OWN_CGROUP) -> int:
    """The CPUs this process may run on, fewer where a cgroup's quota allows less CPU
    time than that (a quota of 1.5 CPUs counts 2); at least 1."""
    cpus = _affinity()
    quota = _quota_cpus(root, own)
    if quota is not None:
        cpus = min(cpus, max(1, math.ceil(quota)))
    return max(1, cpus)


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def _quota_cpus(root: Path, own: Path) -> float | None:
    """The smallest CPU quota over the process's cgroup and its ancestors, in CPUs; None
    where there is none (or the files cannot be read: then nothing limits what we see)."""
    limits = [q for folder in _cgroup_folders(root, own) if (q := _folder_quota(folder))]
    return min(limits, default=None)


def _cgroup_folders(root: Path, own: Path) -> list[Path]:
    """The folders whose quota applies: for each hierarchy the process is in (a line
    ``id:controllers:/path`` of /proc/self/cgroup), its folder and each above it, under
    the mount point (``root`` for v2, ``root/cpu`` or ``root/cpu,cpuacct`` for v1). In a
    container's namespace the path is ``/`` and the mount is the container's own cgroup."""
    try:
        lines = own.read_text().splitlines()
    except OSError:
        lines = []
    folders: list[Path] = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        if controllers and "cpu" not in controllers.split(","):
            continue
        bases = [root] if not controllers else [root / controllers, root / "cpu"]
        for base in bases:
            folder = base / path.lstrip("/")
            folders += [folder, *[p for p in folder.parents if p.is_relative_to(base)]]
    return folders or [root, root / "cpu"]


def _folder_quota(folder: Path) -> float | None:
    """The quota one cgroup folder sets, in CPUs: v2's ``cpu.max`` ("max 100000" or
    "150000 100000"), else v1's quota over its period (-1: none)."""
    text = _read(folder / "cpu.max")
    if text is not None:
        fields = text.split()
        if len(fields) == 2 and fields[0] != "max":
            return _ratio(fields[0], fields[1])
        return None
    quota, period = _read(folder / "cpu.cfs_quota_us"), _read(folder / "cpu.cfs_period_us")
    if quota is None or period is None:
        return None
    return _ratio(quota, period)


def _ratio(quota: str, period: str) -> float | None:
    try:
        q, p = int(quota), int(period)
    except ValueError:
        return None
    return q / p if q > 0 and p > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None
