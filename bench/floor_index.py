"""The floor of answering an unchanged cache from kcache's index, in Python, for any layout: what an exact
index cannot skip, end to end, and nothing else (no rule, no Entry, no kcache module loaded).

  1. start Python and read the index kcache wrote for ROOT (`.kcache/index/scan.<euid>`), unpickling its
     records as kcache loads them;
  2. lstat each recorded entry directory and each file its record names (what proves it unchanged),
     split over `--procs` forked processes as kcache's scan is;
  3. write one JSON document holding each record's stored fields (the answer `ls --json` prints).

Run `kcache ls --json` on ROOT first: it writes the index. bench_layouts.py times this against `du -sb`
and against kcache's own unchanged listing of the same tree.

Usage: python bench/floor_index.py ROOT [--procs N]
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forked import root_and_procs, split_over  # noqa: E402

# kcache_cli/catalog/index.py's framing (copied: the floor loads no kcache code): magic, the number of
# parts ("<I"), each part's (length, CRC-32) as "<QI", then the parts: the pickled {"context": ...,
# "records": {path: record}}, then pickles of more records ({path: record}, one per worker that made some).
MAGIC = b"KCACHE-SCAN-INDEX-2\n"
PARTS = struct.Struct("<I")
HEADER = struct.Struct("<QI")


def records(root: str) -> dict:
    with open(os.path.join(root, ".kcache", "index", f"scan.{os.geteuid()}"), "rb") as f:
        data = f.read()
    if not data.startswith(MAGIC):
        raise SystemExit(f"{root} has no kcache index: run `kcache ls --json` on it first")
    (n,) = PARTS.unpack_from(data, len(MAGIC))
    at = len(MAGIC) + PARTS.size
    lengths = [HEADER.unpack_from(data, at + i * HEADER.size)[0] for i in range(n)]
    at += n * HEADER.size
    view, parts = memoryview(data), []
    for length in lengths:
        parts.append(pickle.loads(view[at:at + length]))
        at += length
    recs = parts[0]["records"]
    for more in parts[1:]:
        recs.update(more)
    return recs


def prove(recs: dict, paths: list[str]) -> None:
    """What proves each entry unchanged: an lstat of its directory and of each file its record names."""
    lstat = os.lstat
    for path in paths:
        lstat(path)
        prefix = path + os.sep
        for name in recs[path][0]:
            lstat(prefix + name)


def main(argv: list[str]) -> int:
    root, procs = root_and_procs(argv)
    recs = records(root)
    paths = list(recs)
    split_over(paths, procs, lambda part: prove(recs, part))
    fields = [f"f{i}" for i in range(max((len(r[3]) for r in recs.values()), default=0))]
    sys.stdout.write(json.dumps({"entries": [dict(zip(fields, r[3])) for r in recs.values()]}) + "\n")
    return len(paths)


if __name__ == "__main__":
    main(sys.argv[1:])
