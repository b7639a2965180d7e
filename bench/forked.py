"""What the floors (bench/floor_*.py) share: one way to split work over processes as kcache's scan does
(fork, each process its share, what it returns written to stdout, the first share done in this process),
their arguments, and one way to read part of a file. No kcache code."""

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


def read_at(fd: int, name: str, n: int = -1, at: int = 0) -> bytes:
    """`n` bytes (all: -1) of the file `name` in the directory `fd`, from offset `at` (from its end:
    negative): open, fstat, pread, close, no link followed."""
    f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    try:
        size = os.fstat(f).st_size
        return os.pread(f, size if n < 0 else n, at if at >= 0 else max(size + at, 0))
    finally:
        os.close(f)
