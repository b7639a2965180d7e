"""How the core reports progress: one small interface (the CLI adapts it to a Rich bar on a terminal).

The core calls `start(total)` once when it knows how much work there is (bytes or items, as the
caller documents), then `advance(n)` as work gets done, from the thread doing it. Implementations must
be cheap to call often and must not start threads (the core may fork workers while a bar is shown)."""

from __future__ import annotations

from typing import Protocol


class Progress(Protocol):
    def start(self, total: int) -> None: ...

    def advance(self, n: int) -> None: ...


class NoProgress:
    """Progress nobody watches."""

    def start(self, total: int) -> None:
        pass

    def advance(self, n: int) -> None:
        pass


NO_PROGRESS = NoProgress()
