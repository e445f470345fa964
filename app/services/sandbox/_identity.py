"""Who a sandbox runs as, and what it can reach.

A sandbox handles a hostile model, so it must not be the service: the service's user
can read ``/proc/PARENT/environ`` (the database password), the whole data directory
(other tenants' artifacts, the SQLite file) and connect to PostgreSQL and Redis.

* A parent running as root (most containers, these machines) starts the sandbox as
  root only long enough for it to set its limits and leave the network (a network
  namespace of its own, with nothing in it), then the sandbox drops to an unprivileged
  user (``SandboxIdentity``, ``nobody`` by default), with no supplementary groups, no
  new privileges and not dumpable (no other process of that user may read its memory or
  its ``/proc`` files). The parent gives that user its own folder (``grant``) and, for
  the API's checks, read access to the one upload it checks (``share_read``); the data
  directory itself is searchable but not listable, and everything else in it is the
  service's alone (``secure_data_dir``).
* A parent that is not root cannot switch users: it says so at start and makes itself
  non-dumpable (``protect_process``), so that at least its own memory and environment
  stay out of the sandbox's reach.

Standard library only: the sandbox's side (``drop_to``, ``leave_network``) runs before
its limits are in place.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "SandboxIdentity",
    "drop_to",
    "grant",
    "leave_network",
    "protect_process",
    "resolve_identity",
    "secure_data_dir",
    "share_read",
    "unreachable",
]

_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38
_CLONE_NEWNET = 0x40000000
# Folders of the data directory a sandbox passes through to reach its own: searchable by
# anyone (mode 711), listable by nobody but the service.
_PASSAGE_MODE = 0o711


@dataclass(frozen=True)
class SandboxIdentity:
    """The unprivileged user a sandbox drops to."""

    name: str
    uid: int
    gid: int

    def as_request(self) -> dict[str, int]:
        return {"uid": self.uid, "gid": self.gid}


def resolve_identity(user: str) -> SandboxIdentity | None:
    """The identity sandboxes run as: ``user`` when this process is root and ``user`` is
    set; None (the service's own user) otherwise. Raises ValueError for an unknown user
    or for root itself."""
    if not user or os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(user) if not user.isdigit() else pwd.getpwuid(int(user))
    except KeyError:
        raise ValueError(
            f"the sandbox user {user!r} does not exist on this machine: create it, or set "
            "AUTOFUSION_SANDBOX_USER to an existing unprivileged user (e.g. nobody)"
        ) from None
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise ValueError(
            f"the sandbox user {user!r} is root or in root's group: a sandbox must run as an "
            "unprivileged user; set AUTOFUSION_SANDBOX_USER to one (e.g. nobody)"
        )
    return SandboxIdentity(entry.pw_name, entry.pw_uid, entry.pw_gid)


def _prctl(option: int, value: int) -> bool:
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    return libc.prctl(option, value, 0, 0, 0) == 0


def protect_process() -> bool:
    """Make this process non-dumpable: processes of the same user can no longer read its
    memory, environment or open files through ``/proc``. Whether it worked."""
    try:
        return _prctl(_PR_SET_DUMPABLE, 0)
    except (OSError, AttributeError):  # not Linux
        return False


def grant(folder: Path, identity: SandboxIdentity | None) -> None:
    """Give ``folder`` and everything in it to ``identity``: its own place to write."""
    if identity is None:
        return
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            os.chown(os.path.join(root, name), identity.uid, identity.gid, follow_symlinks=False)
    os.chown(folder, identity.uid, identity.gid)


def share_read(paths: list[Path], identity: SandboxIdentity | None) -> None:
    """Let ``identity`` read ``paths`` (files, and the folders that hold them) through
    its group, without write access: an upload the API's sandbox checks."""
    if identity is None:
        return
    for path in paths:
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):  # chmod would follow it to wherever it points
            continue
        os.chown(path, -1, identity.gid, follow_symlinks=False)
        extra = stat.S_IRGRP | (stat.S_IXGRP if stat.S_ISDIR(mode) else 0)
        os.chmod(path, (stat.S_IMODE(mode) | extra) & ~stat.S_IWGRP)


def unreachable(path: Path, identity: SandboxIdentity | None) -> Path | None:
    """The first folder on the way to the folder ``path``, or ``path`` itself, that
    ``identity`` may not pass through (no search permission for others), or None."""
    if identity is None:
        return None
    path = Path(path).resolve()
    for folder in [*reversed(path.parents), path]:
        if not os.stat(folder).st_mode & stat.S_IXOTH:
            return folder
    return None


def secure_data_dir(data_dir: Path, passages: list[Path]) -> None:
    """The data directory as a sandbox user may see it: ``data_dir`` and ``passages``
    (the folders sandboxes' own folders are in) searchable, not listable; every other
    entry of ``data_dir`` (the artifacts, the database file, the broker's folder) the
    service's alone."""
    data_dir.mkdir(parents=True, exist_ok=True)
    keep = {p.resolve() for p in passages}
    for entry in data_dir.iterdir():
        if entry.resolve() in keep or entry.is_symlink():
            continue
        os.chmod(entry, 0o700 if entry.is_dir() else 0o600)
    for folder in [data_dir, *passages]:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, _PASSAGE_MODE)


def leave_network() -> str | None:
    """Move this process into a network namespace of its own (nothing in it, not even
    loopback up): no connection to the database, the broker or anything else. None when
    done, else why not (not root, a container that forbids it)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        if libc.unshare(_CLONE_NEWNET) == 0:
            return None
        return os.strerror(ctypes.get_errno())
    except (OSError, AttributeError) as exc:
        return str(exc)


def drop_to(identity: dict[str, int]) -> None:
    """Become ``identity`` for good (``{"uid", "gid"}``): no supplementary groups, no
    way back, no new privileges through exec, not dumpable."""
    os.setgroups([])
    os.setresgid(identity["gid"], identity["gid"], identity["gid"])
    os.setresuid(identity["uid"], identity["uid"], identity["uid"])
    if os.getresuid() != (identity["uid"],) * 3:  # never go on as root
        raise PermissionError(f"could not drop to uid {identity['uid']}")
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)
    _prctl(_PR_SET_DUMPABLE, 0)
