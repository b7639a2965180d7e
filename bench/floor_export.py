"""The floor of `kcache export` in Python: per file exactly what an archive a verified import can trust
needs, and nothing else (no judgement, no manifest, no rule on names or links, no lock).

Each process walks its share of the entry directories through directory fds (as kcache does: never a
path followed), and for each regular file opens it (O_NOFOLLOW, O_NOATIME), fstats it, reads it whole,
closes it, hashes it (sha256: the manifest's digest import checks) and appends a ustar header, the
bytes and the padding to a zstd stream (level 3, compressed in a thread beside the reads, as kcache
and `tar --zstd` do). The processes' streams are concatenated into OUT (zstd frames concatenate).
bench_archive.py's `--floor` times it against `tar --zstd` and `kcache export` of the same tree.

Usage: python bench/floor_export.py ROOT OUT [--procs N] [--depth D]
  D: how deep below ROOT the entry directories are (hidet: ops/<space>/<op>/<hash> = 4).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import queue
import sys
import tempfile
import threading

import zstandard

_NUL = b"\0"
_NOATIME = getattr(os, "O_NOATIME", 0)
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | _NOATIME
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _header(name: str, size: int, mode: int, mtime: int, flag: bytes = b"0") -> bytes:
    """A plain ustar header (the short ASCII names of a generated cache)."""
    block = b"".join((name.encode().ljust(100, _NUL), b"%07o\0" % (mode & 0o7777), b"0000000\0" * 2,
                      b"%011o\0" % size, b"%011o\0" % mtime, b" " * 8, flag, _NUL * 100,
                      b"ustar\x0000", _NUL * 64, b"0000000\0" * 2, _NUL * 167))
    return b"%s%06o\0 %s" % (block[:148], sum(block), block[156:])


def _entries(root: str, depth: int) -> list[str]:
    """The directories `depth` levels below `root`, relative to it, sorted."""
    level = [""]
    for _ in range(depth):
        nxt = []
        for rel in level:
            with os.scandir(os.path.join(root, rel) if rel else root) as it:
                nxt += [f"{rel}/{de.name}" if rel else de.name for de in it
                        if de.is_dir(follow_symlinks=False) and not de.name.startswith(".")]
        level = sorted(nxt)
    return level


def _entry(rfd: int, rel: str, put) -> None:
    """One entry directory, its files in name order (one level: a generated hidet entry has no subdir)."""
    fd = os.open(rel, _DIR, dir_fd=rfd)
    try:
        put(_header(rel + "/", 0, 0o755, int(os.fstat(fd).st_mtime), b"5"))
        with os.scandir(fd) as it:
            names = sorted(de.name for de in it if de.is_file(follow_symlinks=False))
        for name in names:
            f = os.open(name, _FILE, dir_fd=fd)
            try:
                st = os.fstat(f)
                data = os.read(f, st.st_size)
            finally:
                os.close(f)
            hashlib.sha256(data).hexdigest()
            put(_header(f"{rel}/{name}", len(data), st.st_mode, int(st.st_mtime)))
            put(data)
            put(_NUL * (-len(data) % 512))
    finally:
        os.close(fd)


def _compress_into(path: str, chunks: queue.Queue) -> None:
    with open(path, "wb") as out:
        comp = zstandard.ZstdCompressor(level=3).compressobj()
        while (item := chunks.get()) is not None:
            out.write(comp.compress(item))
        out.write(comp.flush())


def _work(root: str, rels: list[str], path: str) -> None:
    chunks: queue.Queue = queue.Queue(maxsize=8)
    t = threading.Thread(target=_compress_into, args=(path, chunks))
    t.start()
    rfd = os.open(root, _DIR)
    pieces: list[bytes] = []
    for rel in rels:
        _entry(rfd, rel, pieces.append)
        if len(pieces) > 256:
            chunks.put(b"".join(pieces))
            pieces = []
    chunks.put(b"".join(pieces))
    chunks.put(None)
    t.join()
    os.close(rfd)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("out")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--depth", type=int, default=4)
    args = ap.parse_args(argv)
    rels = _entries(args.root, args.depth)
    n = max(args.procs, 1)
    size = -(-len(rels) // n)
    tmp = tempfile.mkdtemp(dir=os.path.dirname(os.path.abspath(args.out)))
    paths = [os.path.join(tmp, str(i)) for i in range(n)]
    pids = []
    for i in range(1, n):
        pid = os.fork()
        if pid == 0:
            _work(args.root, rels[i * size:(i + 1) * size], paths[i])
            os._exit(0)
        pids.append(pid)
    _work(args.root, rels[:size], paths[0])
    for pid in pids:
        os.waitpid(pid, 0)
    with open(args.out, "wb") as out:
        for p in paths:
            with open(p, "rb") as f:
                out.write(f.read())
            os.unlink(p)
        out.write(zstandard.ZstdCompressor(level=3).compress(_NUL * 1024))
    os.rmdir(tmp)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
