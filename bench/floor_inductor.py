"""The floor of a cold Inductor listing in Python: per entry exactly the system calls and reads its
judgement cannot skip, and nothing else (no rule, no Entry, no index; one small JSON object per entry).

  every entry   open its directory, fstat it, list it, lstat each file (its sizes and times: du's part);
  fx graph      each guard variant: open, fstat, read its first two bytes and its last (a whole pickle);
  aotautograd   the same, then its variants' whole bytes searched for the fx graph keys they name, and
                an lstat of each graph named (its verdict is the fx graph pass's, as kcache's memo has it);
  code shard    each shared object: open, fstat, read its ELF header (64 bytes);
  Triton kernel (triton/<device>/<key>) the group file and the metadata: open, fstat, read, parse as JSON.

Entries are found as kcache finds them (the root, fxgraph/<xx>/, aotautograd/, triton/<device>/ listed),
fx graphs first, and split over `--procs N` forked processes as kcache's scan is over the cores.
bench_layouts.py times this against `du -sb` of the same tree and against `kcache ls --json --no-index`.

Usage: python bench/floor_inductor.py ROOT [--procs N]
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forked import fx_keys, read_at, run_floor  # noqa: E402

VARIANT = re.compile(r"[a-z2-7]{51}\Z")
SHARD = re.compile(r"[a-z0-9]{2}\Z")


def _jobs(root: str) -> list[tuple[str, str]]:
    """(kind, path relative to the root) of every entry, fx graphs first."""
    graphs, rest = [], []
    for top in sorted(os.listdir(root)):
        here = os.path.join(root, top)
        if top == "fxgraph":
            graphs += [("graph", f"fxgraph/{s}/{k}") for s in os.listdir(here) for k in os.listdir(f"{here}/{s}")]
        elif top == "aotautograd":
            rest += [("autograd", f"aotautograd/{k}") for k in os.listdir(here)]
        elif top == "triton":
            rest += [("triton", f"triton/{d}/{k}") for d in os.listdir(here) for k in os.listdir(f"{here}/{d}")]
        elif SHARD.match(top) and os.path.isdir(here):
            rest.append(("code", top))
    return graphs + rest


def _entry(rfd: int, kind: str, rel: str) -> dict:
    fd = os.open(rel, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=rfd)
    try:
        os.fstat(fd)
        with os.scandir(fd) as it:
            sizes = {de.name: de.stat(follow_symlinks=False).st_size for de in it}
        named = 0
        for name in sizes:
            if kind in ("graph", "autograd") and VARIANT.match(name):
                read_at(fd, name, 2)
                read_at(fd, name, 1, -1)
                if kind == "autograd":
                    for key in set(fx_keys(read_at(fd, name, -1))):
                        k = key.decode()
                        os.lstat(f"fxgraph/{k[1:3]}/{k}", dir_fd=rfd)
                        named += 1
            elif kind == "code" and name.endswith(".so"):
                read_at(fd, name, 64)
            elif kind == "triton" and name.endswith(".json"):
                json.loads(read_at(fd, name, -1))
    finally:
        os.close(fd)
    return {"kind": kind, "path": rel, "size": sum(sizes.values()), "files": len(sizes), "graphs": named}


def _part(root: str, jobs: list[tuple[str, str]]) -> str:
    rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return "\n".join(json.dumps(_entry(rfd, kind, rel)) for kind, rel in jobs) + "\n"
    finally:
        os.close(rfd)


def main(argv: list[str]) -> int:
    return run_floor(argv, _jobs, _part)


if __name__ == "__main__":
    main(sys.argv[1:])
