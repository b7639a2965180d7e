"""The floor of a cold hidet listing in Python: per op entry exactly the system calls and reads its cheap
judgement cannot skip where no file tells that the entry is finished (a cache copied with one mtime on every
file, bench_scan.py's `equal` shape), and nothing else (no rule, no Entry, no index; one small JSON object
per entry):

  every entry   open its directory from its op directory's, fstat it, list it, lstat each file (its sizes
                and times: du's part);
  its files     lib.so's ELF header (64 bytes: a whole shared object of this machine's class) and meta.json
                (read, parsed as JSON): what `kcache ls` reads of each entry of that shape (strace shows
                the same two; version.txt decides only whether meta.json is read, and a whole meta.json
                is complete either way: layouts/hidet.py _plain_op).

Entries are found as kcache finds them (ops/<space>/<op>/<hash>), and split over `--procs N` forked
processes as kcache's scan is over the cores. bench_scan.py times this against `du -sb` of the same tree
and against `kcache ls --json --no-index`.

Usage: python bench/floor_hidet.py ROOT [--procs N]
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forked import read_at, run_floor  # noqa: E402

_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _jobs(root: str) -> list[tuple[str, str]]:
    """(op directory relative to the root, entry name) of every op entry."""
    ops = os.path.join(root, "ops")
    return [(f"ops/{space}/{op}", h) for space in sorted(os.listdir(ops)) for op in sorted(os.listdir(f"{ops}/{space}"))
            for h in sorted(os.listdir(f"{ops}/{space}/{op}"))]


def _judge(parent: int, name: str) -> str:
    fd = os.open(name, _DIR, dir_fd=parent)
    try:
        os.fstat(fd)
        with os.scandir(fd) as it:
            sizes = {de.name: de.stat(follow_symlinks=False).st_size for de in it}
        elf = read_at(fd, "lib.so", 64) if "lib.so" in sizes else b""
        meta = json.loads(read_at(fd, "meta.json")) if "meta.json" in sizes else None
    finally:
        os.close(fd)
    whole = elf[:4] == b"\x7fELF" and isinstance(meta, dict)
    return json.dumps({"hash": name, "size": sum(sizes.values()), "whole": whole})


def _part(root: str, jobs: list[tuple[str, str]]) -> str:
    rfd = os.open(root, _DIR)
    held: dict[str, int] = {}  # each op directory opened once, as kcache opens its entries from it
    out = []
    try:
        for where, name in jobs:
            parent = held.get(where)
            if parent is None:
                parent = held[where] = os.open(where, _DIR, dir_fd=rfd)
            out.append(_judge(parent, name))
    finally:
        for fd in (rfd, *held.values()):
            os.close(fd)
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    return run_floor(argv, _jobs, _part)


if __name__ == "__main__":
    main(sys.argv[1:])
