"""What the floors (bench/floor_*.py) share: one way to split work over processes as kcache's scan does
(fork, each process its share, what it returns written to stdout, the first share done in this process),
their arguments, one way to read part of a file, and the search for the fx graph keys an aotautograd variant
names (as kcache searches it). No kcache code."""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Callable


BLOCK = 256  # kcache's scan claims its jobs so many at a time (catalog/scan_context.py, util/parallel.py Claims)


def split_over(items: list, procs: int, work: Callable[[list], str | None]) -> None:
    """`work(part)` in `procs` processes (`procs - 1` forked), the items dealt a BLOCK at a time (one at a
    time, a tree whose kinds alternate gave one process all the costly ones); each one's text goes to
    stdout. kcache's scan has its processes claim the blocks as each is free (util/parallel.py Claims): on a
    quiet machine that comes to the same even shares, and a floor has no other work to balance."""
    n = max(procs, 1)
    parts = [[x for b in range(i * BLOCK, len(items), n * BLOCK) for x in items[b:b + BLOCK]] for i in range(n)]
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


def run_floor(argv: list[str], jobs_of: Callable[[str], list], part: Callable[[str, list], str]) -> int:
    """A floor's main: ROOT [--procs N], its jobs (`jobs_of(root)`) dealt over the processes, each share's
    text (`part(root, share)`) to stdout. How many jobs there were."""
    root, procs = root_and_procs(argv)
    jobs = jobs_of(root)
    split_over(jobs, procs, lambda share: part(root, share))
    return len(jobs)


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


FX_KEY = re.compile(rb"f[a-z2-7]{51}")
_KEY_MARKS = bytes(0x6B if chr(c) in "abcdefghijklmnopqrstuvwxyz234567" else 0x2E for c in range(256))
_KEY_RUN = b"k" * 52


def fx_keys(data: bytes) -> list[bytes]:
    """FX_KEY.findall(data), searched only in the runs of 52 or more bytes a key may hold (kcache's
    inductor.fx_keys: the same keys, faster)."""
    marks = data.translate(_KEY_MARKS)
    out: list[bytes] = []
    start = marks.find(_KEY_RUN)
    while start >= 0:
        end = marks.find(b".", start + len(_KEY_RUN))
        end = len(data) if end < 0 else end
        out += FX_KEY.findall(data, start, end)
        start = marks.find(_KEY_RUN, end)
    return out
