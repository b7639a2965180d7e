"""The floor of a Triton listing in Python: per key directory exactly the system calls a judgement cannot
skip, and nothing else (no rule, no Entry, no index file; the output is one small JSON object per kernel).

  cold  open the directory, fstat it, list it, lstat each file, open, fstat and read the group file and
        the metadata, parse both as JSON;
  warm  what proves an indexed entry unchanged: lstat the directory and each of its files by name, the
        names loaded from a pickle as the index loads its records (`--warm FILE`: written by the first
        run, which lists the tree; bench_layouts.py's warm-up run).

`--procs N` splits the keys over N forked processes, as kcache's scan does over the cores.
bench_layouts.py times both against `du -sb` of the same tree.

Usage: python bench/floor_triton.py ROOT [--warm NAMES.pickle] [--procs N]
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forked import split_over  # noqa: E402


def _cold(root: str, keys: list[str]) -> list[str]:
    rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    out = []
    for key in keys:
        fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=rfd)
        os.fstat(fd)
        with os.scandir(fd) as it:
            names = [de.name for de in it if de.stat(follow_symlinks=False)]
        for name in names:
            if name.endswith(".json"):  # the group file and the metadata
                f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
                data = os.read(f, os.fstat(f).st_size + 1)  # not 1 MiB: os.read allocates all it asks for
                os.close(f)
                json.loads(data)
        os.close(fd)
        out.append(json.dumps({"hash": key, "files": len(names)}))
    os.close(rfd)
    return out


def _warm(root: str, keys: list[str], names: dict[str, list[str]]) -> list[str]:
    out = []
    lstat = os.lstat
    for key in keys:
        prefix = f"{root}/{key}"
        lstat(prefix)
        size = sum(lstat(f"{prefix}/{n}").st_size for n in names[key])
        out.append(json.dumps({"hash": key, "size": size}))
    return out


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--warm", metavar="NAMES", help="the names' pickle (written when missing)")
    ap.add_argument("--procs", type=int, default=1)
    args = ap.parse_args(argv)
    root = args.root.rstrip("/")
    names: dict[str, list[str]] = {}
    if args.warm and os.path.exists(args.warm):
        with open(args.warm, "rb") as f:
            names = pickle.load(f)
        keys = list(names)
    else:
        with os.scandir(root) as it:
            keys = [de.name for de in it if de.is_dir(follow_symlinks=False) and not de.name.startswith(".")]
    if args.warm and not names:
        names = {k: os.listdir(f"{root}/{k}") for k in keys}
        with open(args.warm, "wb") as f:
            pickle.dump(names, f)
    def work(part: list[str]) -> str:
        return "\n".join(_warm(root, part, names) if args.warm else _cold(root, part)) + "\n"

    split_over(keys, args.procs, work)
    return len(keys)


if __name__ == "__main__":
    main(sys.argv[1:])
