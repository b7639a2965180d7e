"""The floors' one way to split work over processes as kcache's scan does (bench/floor_*.py): fork, each
process its share, what it returns written to stdout, the first share done in this process. No kcache code."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable


def split_over(items: list, procs: int, work: Callable[[list], str | None]) -> None:
    """`work(items[i::procs])` in `procs` processes (`procs - 1` forked); each one's text goes to stdout."""
    parts = [items[i::procs] for i in range(max(procs, 1))]
    pids = []
    for part in parts[1:]:
        pid = os.fork()
        if pid == 0:
            _write(work(part))
            os._exit(0)
        pids.append(pid)
    _write(work(parts[0]))
    for pid in pids:
        os.waitpid(pid, 0)


def _write(text: str | None) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def root_and_procs(argv: list[str]) -> tuple[str, int]:
    """The arguments every floor takes: ROOT [--procs N]."""
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--procs", type=int, default=1)
    args = ap.parse_args(argv)
    return args.root, args.procs
