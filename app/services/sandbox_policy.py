"""The sandbox as the settings ask for it: who it runs as, what its request says about
its isolation, and the data directory made ready for it when a process starts.

``app.services.sandbox`` knows nothing of settings (a sandbox imports it before its
limits are in place); the two parents (``worker.execute`` for jobs,
``app.services.model_work`` for the API's checks and trials) ask here.
"""

from __future__ import annotations

import logging
import os
import sysconfig
from functools import lru_cache
from pathlib import Path
from typing import Any

from autofusion.app.core.config import Settings
from autofusion.app.services.sandbox import (
    CODE_ROOT,
    SandboxIdentity,
    protect_process,
    resolve_identity,
    secure_data_dir,
    unreachable,
)
from autofusion.fusion_core.profiling.cpus import usable_cpus

__all__ = [
    "isolation_request",
    "job_cpu_limit_s",
    "prepare_data_dir",
    "sandbox_identity",
]

logger = logging.getLogger(__name__)


@lru_cache(maxsize=8)
def _identity(user: str) -> SandboxIdentity | None:
    identity = resolve_identity(user)
    blocked = _runtime_out_of_reach(identity)
    if identity is not None and blocked is not None:
        # It could not even import the standard library: the service's user it is, said
        # loudly, rather than no sandbox at all.
        logger.warning(
            "sandboxes run as the service's own user, not %s: %s cannot pass through %s "
            "to run this Python and its packages; install Python where every user can run "
            "it (as the image does) or 'chmod o+x %s'",
            identity.name,
            identity.name,
            blocked,
            blocked,
        )
        return None
    return identity


def _runtime_out_of_reach(identity: SandboxIdentity | None) -> Path | None:
    """The first folder on the way to this interpreter's standard library, its packages
    or this code that ``identity`` may not pass through."""
    places = {
        Path(os.__file__).parent,
        Path(sysconfig.get_paths()["purelib"]),
        Path(sysconfig.get_paths()["platlib"]),
        Path(CODE_ROOT),
    }
    for place in sorted(places):
        blocked = unreachable(place, identity)
        if blocked is not None:
            return blocked
    return None


def sandbox_identity(settings: Settings) -> SandboxIdentity | None:
    """Who sandboxes run as here: None when this process is not root or the setting is
    empty (they run as the service's user)."""
    return _identity(settings.sandbox_user)


def isolation_request(settings: Settings, *, file_size_limit_mb: int) -> dict[str, Any]:
    """The part of a sandbox's request that isolates it (``sandbox_main`` reads it)."""
    identity = sandbox_identity(settings)
    return {
        "identity": identity.as_request() if identity else None,
        "isolate_network": settings.sandbox_isolate_network,
        "process_limit": settings.sandbox_max_processes,
        "file_size_limit_mb": file_size_limit_mb,
    }


def prepare_data_dir(settings: Settings, role: str) -> None:
    """At a process's start (``role``: "api" or "worker"): the data directory made ready
    for sandboxes of another user, or this process protected where they cannot have one;
    one log line says which. Raises ValueError when the sandbox user cannot be used."""
    identity = sandbox_identity(settings)
    if identity is None:
        _protect_alone(settings, role)
        return
    passages = [settings.jobs_dir, settings.uploads_dir]
    secure_data_dir(settings.data_dir, passages)
    blocked = unreachable(settings.jobs_dir, identity)
    if blocked is not None:
        raise ValueError(
            f"the sandbox user {identity.name!r} cannot reach {settings.jobs_dir}: "
            f"{blocked} is not searchable by other users; run 'chmod o+x {blocked}', move "
            "AUTOFUSION_DATA_DIR, or set AUTOFUSION_SANDBOX_USER= to run sandboxes as the "
            "service's own user"
        )
    logger.info(
        "%s: sandboxes run as %s (uid %d), network %s",
        role,
        identity.name,
        identity.uid,
        "isolated" if settings.sandbox_isolate_network else "shared (sandbox_isolate_network)",
    )


def job_cpu_limit_s(settings: Settings) -> int:
    """A job sandbox's CPU seconds: the setting, or the time limit on every CPU the
    service may use (its container's, not the host's)."""
    if settings.job_cpu_limit_s is not None:
        return settings.job_cpu_limit_s
    return settings.job_time_limit_s * usable_cpus()


def _protect_alone(settings: Settings, role: str) -> None:
    protected = protect_process()
    why = "the service is not root" if os.geteuid() != 0 else "sandbox_user is empty"
    logger.warning(
        "%s: sandboxes run as the service's own user (%s): they can read what it can "
        "read in %s; this process is %s",
        role,
        why,
        Path(settings.data_dir).resolve(),
        "non-dumpable" if protected else "dumpable (prctl failed)",
    )
