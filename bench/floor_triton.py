"""The floor of a cold Triton listing in Python, one process: per key directory exactly the system calls the
cheap judgement cannot skip (open the directory, fstat it, list it, lstat each file, open, fstat and read
the group file and the metadata, parse both as JSON) and nothing else: no rule, no Entry, no output.
bench_layouts.py times it against `du -sb` of the same tree.

Usage: python bench/floor_triton.py ROOT
"""

from __future__ import annotations

import json
import os
import sys


def main(root: str) -> int:
    rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    with os.scandir(rfd) as it:
        keys = [de.name for de in it if de.is_dir(follow_symlinks=False) and not de.name.startswith(".")]
    for key in keys:
        fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=rfd)
        os.fstat(fd)
        with os.scandir(fd) as it:
            names = [de.name for de in it if de.stat(follow_symlinks=False)]
        for name in names:
            if name.endswith(".json"):  # the group file and the metadata
                f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
                os.fstat(f)
                data = os.read(f, 1 << 20)
                os.close(f)
                json.loads(data)
        os.close(fd)
    os.close(rfd)
    return len(keys)


if __name__ == "__main__":
    main(sys.argv[1])
