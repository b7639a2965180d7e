"""The one Rich adapter of kcache_cli.progress.Progress: a bar on stderr, only on a terminal and never
with -q. It draws when it is advanced (Rich's auto-refresh thread is off): the core forks worker
processes while a bar is shown, and forking a process that runs threads can deadlock the child."""

from __future__ import annotations

import sys
import time
from typing import Any

from kcache_cli.cli import common as c

REDRAW = 0.1  # seconds between redraws at most


class Bar:
    """`with Bar(opts, "importing", unit="bytes") as bar: core_call(progress=bar)`. `unit` is "bytes"
    (sizes and a transfer speed) or "items" (a count); `status(text)` changes the description.
    `animate` redraws from Rich's own thread too: only for work that never forks (builds run compilers
    in threads)."""

    def __init__(self, opts: c.GlobalOptions, description: str, unit: str = "items", animate: bool = False) -> None:
        self.enabled = sys.stderr.isatty() and not opts.quiet
        self.description = description
        self.unit = unit
        self.animate = animate
        self._progress: Any = None
        self._task: Any = None
        self._drawn = 0.0

    def __enter__(self) -> Bar:
        if self.enabled:
            from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                       TextColumn, TimeRemainingColumn, TransferSpeedColumn)

            cols: list = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
            cols += [DownloadColumn(), TransferSpeedColumn()] if self.unit == "bytes" else [MofNCompleteColumn()]
            cols.append(TimeRemainingColumn())
            self._progress = Progress(*cols, console=c.stderr_console(), transient=True,
                                      auto_refresh=self.animate)
            self._progress.start()
            self._task = self._progress.add_task(self.description, total=None)
            self._progress.refresh()
        return self

    def start(self, total: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=total)
            self._draw(force=True)

    def advance(self, n: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)
            self._draw()

    def status(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=text)
            self._draw(force=True)

    def print(self, message: str) -> None:
        """A line for people above the bar (or on stderr when there is none)."""
        if self._progress is not None:
            self._progress.console.print(message, markup=False, highlight=False, soft_wrap=True)
        else:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._drawn >= REDRAW:
            self._drawn = now
            self._progress.refresh()

    def __exit__(self, *exc: object) -> None:
        if self._progress is not None:
            self._progress.stop()
