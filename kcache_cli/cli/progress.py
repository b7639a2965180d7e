"""The one Rich adapter of kcache_cli.util.progress.Progress: a bar on stderr, only on a terminal and never
with -q. It draws when it is advanced (Rich's auto-refresh thread is off): the core forks worker
processes while a bar is shown, and forking a process that runs threads can deadlock the child."""

from __future__ import annotations

import sys
import time
from typing import Any

from kcache_cli.cli import common as c
from kcache_cli.cli import options as o

REDRAW = 0.1  # seconds between redraws at most


class Bar:
    """`with Bar(opts, "importing", unit="bytes") as bar: core_call(progress=bar)`. `unit` is "bytes"
    (sizes and a transfer speed), "items" (a count) or "judged" (a scan: "judged N of M entries
    found", M growing as entries are found); `status(text)` changes the description.
    `animate` redraws from Rich's own thread too: only for work that never forks (builds run compilers
    in threads). With `delay`, nothing shows until the work has taken that many seconds (a scan
    that answers at once draws no bar)."""

    def __init__(self, opts: o.GlobalOptions, description: str, unit: str = "items", animate: bool = False,
                 delay: float = 0.0) -> None:
        self.enabled = sys.stderr.isatty() and not opts.quiet
        self.description = description
        self.unit = unit
        self.animate = animate
        self.delay = delay
        self._progress: Any = None
        self._task: Any = None
        self._drawn = 0.0
        self._since = 0.0
        self._total: int | None = None
        self._done = 0

    def __enter__(self) -> Bar:
        self._since = time.monotonic()
        if self.enabled and self.delay <= 0:
            self._show()
        return self

    def _columns(self) -> list:
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            SpinnerColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        cols: list = [SpinnerColumn(), TextColumn("{task.description}", markup=False), BarColumn()]
        if self.unit == "judged":
            return cols + [TextColumn("judged {task.completed:,.0f} of {task.fields[found]} found")]
        cols += [DownloadColumn(), TransferSpeedColumn()] if self.unit == "bytes" else \
            [TextColumn("{task.fields[count]}", markup=False)]
        return cols + [TextColumn("eta"), TimeRemainingColumn()]  # as pip's: "eta 0:00:02"

    def _show(self) -> None:
        from rich.progress import Progress

        self._progress = Progress(*self._columns(), console=c.stderr_console(), transient=True,
                                  auto_refresh=self.animate)
        self._progress.start()
        self._task = self._progress.add_task(self.description, total=self._total, completed=self._done,
                                             found=self._found_text(), count=self._count_text())
        self._progress.refresh()

    def _count_text(self) -> str:
        """What is done of how much, digits grouped: "1,486 of 8,000" ("of ?" before the total is known)."""
        return f"{self._done:,} of {'?' if self._total is None else f'{self._total:,}'}"

    def _found_text(self) -> str:
        """The entries found so far: "1 entry", "2,000 entries", "? entries" before any is counted."""
        return "? entries" if self._total is None else c.plural(self._total, "entry")

    def _shown(self) -> bool:
        """Whether the bar is up, putting it up once the delay has passed."""
        if self._progress is None and self.enabled and time.monotonic() - self._since >= self.delay:
            self._show()
        return self._progress is not None

    def start(self, total: int) -> None:
        self._total = total
        self._sync(force=True)

    def advance(self, n: int) -> None:
        self._done += n
        if self.enabled:  # Rich is told only when it redraws: a scan advances once per entry
            self._sync()

    def restart(self, description: str, total: int) -> None:
        """The next phase of the work, counted from zero."""
        self.description, self._total, self._done = description, total, 0
        if self._progress is not None:
            self._progress.reset(self._task, total=total, description=description, found=self._found_text(),
                                 count=self._count_text())
        self._sync(force=True)

    def status(self, text: str) -> None:
        self.description = text
        self._sync(force=True)

    def _sync(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._drawn < REDRAW or not self._shown():
            return
        self._drawn = now
        self._progress.update(self._task, total=self._total, completed=self._done, description=self.description,
                              found=self._found_text(), count=self._count_text())
        self._progress.refresh()

    def print(self, message: str) -> None:
        """A line for people above the bar (or on stderr when there is none)."""
        if self._progress is not None:
            self._progress.console.print(message, markup=False, highlight=False, soft_wrap=True)
        else:
            sys.stderr.write(message + "\n")
            sys.stderr.flush()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Take the bar down for good (before the `with` ends: the next phase has a bar of its own)."""
        self.enabled = False
        if self._progress is not None:
            self._progress.stop()
            self._progress = None


SCAN_DELAY = 0.5  # seconds a scan runs before its counting bar shows


def scanning(opts: o.GlobalOptions, description: str) -> Bar:
    """The counting bar of a scan ("judged N of M entries found"), shown once it has run SCAN_DELAY."""
    return Bar(opts, description, unit="judged", delay=SCAN_DELAY)


class Phase:
    """A later phase of the work on the same bar (Rich shows one bar at a time): started from zero
    with its own description."""

    def __init__(self, bar: Bar, description: str) -> None:
        self.bar, self.description = bar, description

    def start(self, total: int) -> None:
        self.bar.restart(self.description, total)

    def advance(self, n: int) -> None:
        self.bar.advance(n)
