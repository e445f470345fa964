"""``optimize``'s progress by phase, on stderr: a live line (rich) on a terminal, one
plain line a phase when forced on elsewhere, nothing in a CI log by default.

The phases are the core's own (``fusion_core.run``'s ``on_phase``): load, pre-passes,
fuse, check, save, profile, report. Their durations are not known ahead, so the line
shows the phase and the time spent in it, and each finished phase leaves a line with
its time.
"""

from __future__ import annotations

import sys
import time
from typing import IO, Any

__all__ = ["PHASES", "PhaseProgress", "wanted"]

# The core's phase names, in words.
PHASES = {
    "load": "loading the model",
    "prepasses": "pre-passes (constant folding, shapes)",
    "fuse": "matching and rewriting patterns",
    "check": "checking against the original (onnxruntime)",
    "measure": "measured selection (timing fusion groups in onnxruntime)",
    "progressive": "progressive stages (fuse, check, roll back)",
    "fallback": "the check failed: finding the largest set of fusions that passes",
    "saving": "saving the fused model",
    "profiling": "profiling both models (onnxruntime)",
    "report": "writing the report",
}


def wanted(option: bool | None, stream: IO[str]) -> bool:
    """--progress / --no-progress, else on when ``stream`` is a terminal."""
    if option is not None:
        return option
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class PhaseProgress:
    """A context manager; call it with each phase name as the phase starts."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stderr
        self.current: str | None = None
        self.started = 0.0
        self.live: Any = None  # rich's Progress on a terminal
        self.task: Any = None

    def __enter__(self) -> PhaseProgress:
        if self.stream.isatty():
            self.live = _rich_progress(self.stream)
            self.live.start()
            self.task = self.live.add_task("starting", total=None)
        return self

    def __call__(self, phase: str) -> None:
        self._finish()
        self.current, self.started = phase, time.monotonic()
        words = PHASES.get(phase, phase)
        if self.live is not None:
            self.live.reset(self.task, description=words)
        else:
            self.stream.write(f"autofusion: {words}...\n")
            self.stream.flush()

    def _finish(self) -> None:
        if self.current is None or self.live is None:
            return
        took = time.monotonic() - self.started
        self.live.console.print(f"  [green]done[/] {PHASES.get(self.current, self.current)}"
                                f" [dim]{took:.1f} s[/]")  # fmt: skip

    def __exit__(self, *exc_info: object) -> None:
        if exc_info[0] is None:
            self._finish()
        if self.live is not None:
            self.live.stop()


def _rich_progress(stream: IO[str]) -> Any:
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    console = Console(file=stream, stderr=stream is sys.stderr, highlight=False)
    return Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
