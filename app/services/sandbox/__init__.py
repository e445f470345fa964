"""The sandbox: a child process with limits, where model work runs.

The API process and the worker never parse, fold, infer shapes in or run a model a user
sent: that work runs in a sandbox, so a model that loops forever or allocates 2.5 GB
fails its own request or job and nothing else. This package is the one implementation
both use; each kind of work is a ``SandboxKind`` defined by its entry point:

* ``app.services.api_sandbox``: the API's upload checks and pattern trials, run by
  ``app.services.model_work`` (its slots, its 503, its problems);
* ``worker.sandbox``: a job's optimization, run by ``worker.supervise`` (its heartbeat,
  which renews the job's lease).

The parent's side is ``run_sandbox`` (start, watch, kill; a ``SandboxRun`` says how it
ended), the sandbox's own is ``sandbox_main`` (limits, the drop to its own user, the
work, its result or error file); ``_identity`` says who it runs as and what it reaches.
Standard library only: a sandbox imports this before its limits are in place.
"""

from autofusion.app.services.sandbox._child import EXIT_ERROR, EXIT_ORPHANED, sandbox_main
from autofusion.app.services.sandbox._environment import CODE_ROOT, sandbox_environment
from autofusion.app.services.sandbox._identity import (
    SandboxIdentity,
    grant,
    protect_process,
    resolve_identity,
    secure_data_dir,
    share_read,
    unreachable,
)
from autofusion.app.services.sandbox._kind import Progress, SandboxKind
from autofusion.app.services.sandbox._memory import is_out_of_memory
from autofusion.app.services.sandbox._run import Failure, Report, SandboxRun, run_sandbox

__all__ = [
    "CODE_ROOT",
    "EXIT_ERROR",
    "EXIT_ORPHANED",
    "Failure",
    "Progress",
    "Report",
    "SandboxIdentity",
    "SandboxKind",
    "SandboxRun",
    "grant",
    "is_out_of_memory",
    "protect_process",
    "resolve_identity",
    "run_sandbox",
    "sandbox_environment",
    "sandbox_main",
    "secure_data_dir",
    "share_read",
    "unreachable",
]
