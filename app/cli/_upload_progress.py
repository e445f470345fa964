"""``submit``'s progress for big data files sent through ``/v1/uploads``, on stderr: a
bar per file with bytes, speed and time left (rich, as ``optimize``'s phases) on a
terminal; elsewhere (a CI log, or the base install, which has no rich) a line at each
tenth of a file, and one when a broken transfer resumes.
"""

from __future__ import annotations

from typing import IO, Any

__all__ = ["UploadBars"]

_GIB = 1024**3


def _size(value: int) -> str:
    return f"{value / _GIB:.2f} GiB" if value >= _GIB else f"{value / 1024**2:.1f} MiB"


class UploadBars:
    """Called as ``(name, sent, size)`` while data files go; ``close()`` after."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.live: Any = None
        self.tasks: dict[str, Any] = {}
        self.shown: dict[str, int] = {}  # plain lines: the last tenth written, per file
        if _is_tty(stream):
            self.live = _rich_bars(stream)

    def __call__(self, name: str, sent: int, size: int) -> None:
        if self.live is not None:
            if name not in self.tasks:
                if not self.tasks:
                    self.live.start()
                self.tasks[name] = self.live.add_task(f"uploading {name}", total=size)
            self.live.update(self.tasks[name], completed=sent)
            return
        tenth = sent * 10 // size if size else 10
        last = self.shown.get(name)
        if tenth != last:
            resumed = " (resumed)" if last is not None and tenth < last else ""
            self.stream.write(
                f"autofusion: uploading {name}: {_size(sent)} of {_size(size)} "
                f"({tenth * 10}%){resumed}\n"
            )
            self.stream.flush()
            self.shown[name] = tenth

    def close(self) -> None:
        if self.live is not None and self.tasks:
            self.live.stop()


def _is_tty(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def _rich_bars(stream: IO[str]) -> Any:
    """rich's bars, or None where rich is not installed (the base install)."""
    try:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )
    except ModuleNotFoundError:
        return None
    console = Console(file=stream, highlight=False)
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(binary_units=True),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=console,
    )
