"""``SandboxKind``: one kind of work the sandbox does, as both of its sides know it.

The parent (``run_sandbox``) and the sandbox itself (``sandbox_main``) read the same
object, so the files they exchange are named once: the request the parent writes, the
error file and the result file the sandbox writes, and its log. A kind is defined in the
module that is its entry point (``python -P -m MODULE FOLDER``), which imports only the
standard library at its top, so a parent may import it to start it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["Progress", "SandboxKind"]

# Called by the work with (stage, fraction done): one progress line on the sandbox's stdout.
Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class SandboxKind:
    """What runs in the sandbox, and the files of its folder (names relative to it).

    ``work(folder, request, progress)`` does the work and returns the result to write to
    ``result_file``, or None when it writes its own outputs. ``describe(exc)`` says what
    went wrong, for the error file: a dict with a ``kind`` (``"memory"`` when it ran out
    of its address space; the other kinds are the parent's to read).
    """

    module: str
    request_file: str
    error_file: str
    result_file: str
    log_file: str
    work: Callable[[Path, dict[str, Any], Progress], dict[str, Any] | None]
    describe: Callable[[BaseException], dict[str, Any]]
    # The sandbox's working directory, relative to its folder.
    work_dir: str = "."
    # Further environment variables passed through (a test-only hook).
    keep_env: tuple[str, ...] = ()
    # Above 0: the sandbox yields the CPU to the process it serves.
    niceness: int = 0
