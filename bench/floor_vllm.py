"""The floor of a cold vLLM listing in Python: per unit exactly the system calls and reads its judgement
cannot skip, and nothing else (no rule, no Entry, no index; one small JSON object per unit).

  every unit     open it, then walk its tree: list each directory and lstat every name (its size and
                 newest mtime: du's part);
  every index    (rank_<r>_<d>/[<prefix>/]vllm_compile_cache.py) open, fstat, read, and parse it with
                 ast.literal_eval, as vLLM reads it;
  a binary artifact   open, fstat, and its framing read: 8 bytes per field, the fields ending at its end;
  an unpacked one     (an Inductor cache root) its one aotautograd entry listed, each variant read whole
                 and searched for the fx graph keys it names, an lstat of each graph named; each fx graph
                 listed, each variant's first two bytes and its last read (a whole pickle).

Units are found as kcache finds them (the root listed) and split over `--procs N` forked processes, as
kcache's scan is over the cores. bench_layouts.py times this against `du -sb` of the same tree and against
`kcache ls --json --no-index`.

Usage: python bench/floor_vllm.py ROOT [--procs N]
"""

from __future__ import annotations

import ast
import json
import os
import re
import stat
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from forked import fx_keys, read_at, root_and_procs, split_over  # noqa: E402

UNIT = re.compile(r"[0-9a-f]{10}\Z")
RANK = re.compile(r"rank_\d+_\d+\Z")
INDEX = "vllm_compile_cache.py"
NESTED = ("inductor_cache", "triton_cache")
DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _measure(fd: int) -> tuple[int, float]:
    """(bytes on disk, newest mtime) of the tree open as `fd`: every directory listed, every name lstat'ed."""
    size, newest, stack = 0, 0.0, [fd]
    while stack:
        d = stack.pop()
        try:
            with os.scandir(d) as it:
                for de in it:
                    st = de.stat(follow_symlinks=False)
                    size, newest = size + st.st_blocks * 512, max(newest, st.st_mtime)
                    if de.is_dir(follow_symlinks=False):
                        stack.append(os.open(de.name, DIR, dir_fd=d))
        finally:
            if d != fd:
                os.close(d)
    return size, newest


def _framing(fd: int, name: str) -> bool:
    """A binary CompiledArtifact's fields (8-byte big-endian lengths) end exactly at its end."""
    f = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd)
    try:
        size, offset = os.fstat(f).st_size, 4
        while offset < size:
            raw = os.pread(f, 8, offset)
            if len(raw) < 8:
                break
            offset += 8 + int.from_bytes(raw, "big")
        return offset == size
    finally:
        os.close(f)


def _names_at(fd: int, rel: str) -> list[str]:
    """The names in the directory `rel` below the open `fd` (opened, listed, closed)."""
    d = os.open(rel, DIR, dir_fd=fd)
    try:
        return os.listdir(d)
    finally:
        os.close(d)


def _unpacked(fd: int, name: str) -> int:
    """An unpacked artifact (an Inductor cache root): its aotautograd entry's variants read whole and the
    graphs they name lstat'ed, each fx graph's variants read at both ends. The number of graphs named."""
    named = 0
    root = os.open(name, DIR, dir_fd=fd)
    try:
        for key in _names_at(root, "aotautograd"):
            entry = os.open(f"aotautograd/{key}", DIR, dir_fd=root)
            try:
                for variant in os.listdir(entry):
                    for k in set(fx_keys(read_at(entry, variant))):
                        graph = k.decode()
                        os.lstat(f"fxgraph/{graph[1:3]}/{graph}", dir_fd=root)
                        named += 1
            finally:
                os.close(entry)
        for shard in _names_at(root, "fxgraph"):
            for graph in _names_at(root, f"fxgraph/{shard}"):
                gfd = os.open(f"fxgraph/{shard}/{graph}", DIR, dir_fd=root)
                try:
                    for variant in os.listdir(gfd):
                        read_at(gfd, variant, 2)
                        read_at(gfd, variant, 1, -1)
                finally:
                    os.close(gfd)
    finally:
        os.close(root)
    return named


def _indexes(rank: int) -> list[str]:
    """The indexes of a rank directory: its own and each prefix's (the nested caches are not prefixes)."""
    with os.scandir(rank) as it:
        subs = sorted(de.name for de in it if de.is_dir(follow_symlinks=False) and de.name not in NESTED)
    out = []
    for index in (INDEX, *(f"{s}/{INDEX}" for s in subs)):
        try:
            os.lstat(index, dir_fd=rank)
        except FileNotFoundError:
            continue
        out.append(index)
    return out


def _unit(rfd: int, name: str) -> dict:
    fd = os.open(name, DIR, dir_fd=rfd)
    handles = graphs = 0
    try:
        os.fstat(fd)
        size, newest = _measure(fd)
        for rank in sorted(n for n in os.listdir(fd) if RANK.match(n)):
            rk = os.open(rank, DIR, dir_fd=fd)
            try:
                for index in _indexes(rk):
                    prefix = os.path.dirname(index)
                    for key, handle in ast.literal_eval(read_at(rk, index).decode()).items():
                        handles += 1
                        if key[2] != "inductor_standalone":
                            continue
                        artifact = f"{prefix}/{handle[0]}" if prefix else handle[0]
                        if stat.S_ISDIR(os.lstat(artifact, dir_fd=rk).st_mode):
                            graphs += _unpacked(rk, artifact)
                        else:
                            _framing(rk, artifact)
            finally:
                os.close(rk)
    finally:
        os.close(fd)
    return {"path": name, "size": size, "modified": newest, "handles": handles, "graphs": graphs}


def _part(root: str, units: list[str]) -> str:
    rfd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        return "\n".join(json.dumps(_unit(rfd, u)) for u in units) + "\n"
    finally:
        os.close(rfd)


def main(argv: list[str]) -> int:
    root, procs = root_and_procs(argv)
    units = sorted(n for n in os.listdir(root) if UNIT.match(n))
    split_over(units, procs, lambda part: _part(root, part))
    return len(units)


if __name__ == "__main__":
    main(sys.argv[1:])
