"""Work spread over worker processes: the one way kcache runs in parallel (scan, export, import).

Workers are forked when this process runs no other thread: forking is fast and the workers inherit the
work in memory, so only part numbers and results travel. Forking a process that runs threads (a
progress bar's refresh thread, a pool's manager) can deadlock the child (Python 3.12 warns of it): then
the work goes to a forkserver, which starts clean workers, and everything a part needs travels pickled.
Pools are always created before this module starts any thread of its own."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Sequence

MAX_WORKERS = 8


def cpus() -> int:
    """The CPUs this process may run on (at most MAX_WORKERS)."""
    try:
        return max(1, min(len(os.sched_getaffinity(0)), MAX_WORKERS))
    except (AttributeError, OSError):
        return max(1, min(os.cpu_count() or 1, MAX_WORKERS))


def fork_safe() -> bool:
    """Whether forking now is safe: this process runs no thread but the main one."""
    import multiprocessing

    return threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()


_INHERITED: tuple[Callable[[Any, Any], Any], Any, Sequence[Any]] | None = None


def _inherited_part(i: int) -> Any:
    assert _INHERITED is not None, "set by map_parts before the workers fork"
    func, shared, parts = _INHERITED
    return func(shared, parts[i])


def _pickled_part(args: tuple[Callable[[Any, Any], Any], Any, Any]) -> Any:
    func, shared, part = args
    return func(shared, part)


def map_parts(func: Callable[[Any, Any], Any], shared: Any, parts: Sequence[Any]) -> list[Any]:
    """`[func(shared, part) for part in parts]`, one worker process per part, results in order. `func`
    must be a module-level function (it may have to be pickled, as `shared` and `parts` may). Raises
    what a worker raised; OSError, RuntimeError or ImportError when no worker can be started (callers
    then do the work themselves)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    global _INHERITED
    if fork_safe():
        _INHERITED = (func, shared, parts)
        try:
            with ProcessPoolExecutor(len(parts), mp_context=multiprocessing.get_context("fork")) as pool:
                return list(pool.map(_inherited_part, range(len(parts))))
        finally:
            _INHERITED = None
    with ProcessPoolExecutor(len(parts), mp_context=multiprocessing.get_context("forkserver")) as pool:
        return list(pool.map(_pickled_part, [(func, shared, p) for p in parts]))
