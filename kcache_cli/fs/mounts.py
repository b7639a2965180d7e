"""The mount table, read from /proc/self/mountinfo: where mounts are, and which ones record reads.

A compiler that finds its kernel in the cache reads it (hidet's dlopen of lib.so, Triton's read of the
group file) and writes nothing, so the only trace of the hit is the files' access time. Linux records it
unless the mount says `noatime`: `relatime` (the default) at least once a day and whenever it is older
than the file's mtime, `strictatime` on every read, `lazytime` in memory first. kcache's own reads never
count (fsread opens with O_NOATIME where it may)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from kcache_cli.fs import read as fsread

MOUNTINFO = "/proc/self/mountinfo"
_MAX_BYTES = 4 << 20


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: where, which file system, with which options."""

    point: str  # where it is mounted (octal escapes undone)
    options: frozenset[str]  # per-mount options: rw, noatime, relatime, nodiratime...
    fstype: str
    super_options: frozenset[str]  # the file system's own: lazytime...

    @property
    def records_reads(self) -> bool:
        """Whether reading a file updates its atime here (directories are never asked: kcache lists them)."""
        return "noatime" not in self.options and "noatime" not in self.super_options


def _unescape(text: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def table(path: str = "") -> list[Mount]:
    """Every mount this process sees, in mountinfo's order; [] when it cannot be read (not Linux)."""
    try:
        with open(path or MOUNTINFO, "rb") as f:
            data = f.read(_MAX_BYTES)
    except OSError:
        return []
    out = []
    for line in data.decode("utf-8", "replace").splitlines():
        fields = line.split(" ")
        if len(fields) < 6:
            continue
        try:
            dash = fields.index("-", 6)
        except ValueError:
            dash = len(fields)
        tail = fields[dash + 1:]
        out.append(Mount(_unescape(fields[4]), frozenset(fields[5].split(",")), tail[0] if tail else "",
                         frozenset(tail[2].split(",")) if len(tail) > 2 else frozenset()))
    return out


def mount_of(real: str, mounts: list[Mount]) -> Mount | None:
    """The mount holding the real path `real`: the longest mount point above it (the last one mounted there
    when several are)."""
    best: Mount | None = None
    for m in mounts:
        if (real == m.point or real.startswith(m.point.rstrip("/") + "/")) and \
                (best is None or len(m.point) >= len(best.point)):
            best = m
    return best


class AtimeRule:
    """Which paths under one root sit on a mount that records reads: decided once for the root, and per
    path only when another mount lies below the root."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.path.join(str(root), "")
        real = fsread.real_path(root)
        self.real = os.path.join(real, "")
        mounts = table()
        base = mount_of(real, mounts)
        self.default = base is not None and base.records_reads
        self.below = sorted(((m.point, m.records_reads) for m in mounts if m.point.startswith(self.real)),
                            key=lambda pm: -len(pm[0]))

    def __call__(self, path: str) -> bool:
        if not self.below:
            return self.default
        real = self.real + path[len(self.root):] if path.startswith(self.root) else os.path.realpath(path)
        for point, records in self.below:
            if real == point or real.startswith(point + "/"):
                return records
        return self.default
