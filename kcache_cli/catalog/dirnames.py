"""The names in a cache's big directories, kept between commands for lookups by hash prefix.

`inspect 7ebb`, `log 7ebb`, `clear 7ebb` and the completion of a hash list every directory entries lie in
(64 op directories of a 100,000-entry hidet cache, a Triton root of 10^5 keys) to find the few names that
start with the prefix: listing 10^5 names costs more than the rest of the command. A listing changes only
with its directory: creating, removing or renaming a name in a directory sets its mtime and ctime (POSIX),
and ctime cannot be set from user space. So a listing kept with the directory's device, inode, mtime and
ctime is the listing for as long as an `fstat` of the directory, opened as a listing opens it, gives those
four again. A listing is kept only when its directory had not changed for RACY_SECONDS before it was read
(by the file system's clock, as the scan index counts it): a change within the same timestamp tick could
otherwise keep both times. Every name found this way is still checked by the caller (an lstat) as a name
found by a listing is.

The file is `<root>/.kcache/index/names.<euid>`, this user's alone (state.read_index_file: a regular file
of this user that nobody else may write; written through a temp file renamed over it). Its payload is
NUL-separated fields, six per directory: its path relative to the root, device, inode, mtime_ns, ctime_ns
and its names joined by "/" (no file name holds a NUL or a "/"); a length and CRC-32 header guards it. A
missing, foreign, truncated or garbled file means listing as before. Light on purpose (os, struct,
zlib): a lookup imports it."""

from __future__ import annotations

import os
import struct
import time
import zlib

from kcache_cli.fs import read as fsread
from kcache_cli.fs import state

KIND = "names"
MAGIC = b"KCACHE-DIR-NAMES\n"
_HEADER = struct.Struct("<QI")  # payload length, CRC-32 of the payload
_FIELDS = 6
RACY_SECONDS = 2.0
MIN_BYTES = 16 << 10  # a lookup that lists less (about 1,000 hashes) keeps nothing: it costs nothing to redo
MAX_BYTES = 256 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # as fsread.listdir opens a directory

Key = tuple[int, int, int, int]  # device, inode, mtime_ns, ctime_ns


def _parse(data: bytes | None) -> dict[str, tuple[Key, bytes]]:
    """relpath -> (key, names joined by "/") from a names file's bytes; {} for anything malformed."""
    start = len(MAGIC) + _HEADER.size
    if not data or not data.startswith(MAGIC) or len(data) < start:
        return {}
    length, crc = _HEADER.unpack_from(data, len(MAGIC))
    payload = data[start:]
    if len(payload) != length or zlib.crc32(payload) != crc or not payload:
        return {}
    parts = payload.split(b"\0")
    if len(parts) % _FIELDS:
        return {}
    out: dict[str, tuple[Key, bytes]] = {}
    try:
        for i in range(0, len(parts), _FIELDS):
            rel, dev, ino, mtime, ctime, names = parts[i:i + _FIELDS]
            out[os.fsdecode(rel)] = ((int(dev), int(ino), int(mtime), int(ctime)), names)
    except ValueError:
        return {}
    return out


def _dump(records: dict[str, tuple[Key, bytes]]) -> bytes:
    payload = b"\0".join(b"\0".join((os.fsencode(rel), b"%d" % k[0], b"%d" % k[1], b"%d" % k[2], b"%d" % k[3],
                                     names)) for rel, (k, names) in records.items())
    return MAGIC + _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class DirNames:
    """The kept listings of one cache root: `starting` answers from them where the directory is unchanged
    and lists it otherwise; `save` keeps what was listed anew. One per root and process (`of`): the file is
    read once however many steps of a command look names up."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root).rstrip("/") or "/"
        self._kept: dict[str, tuple[Key, bytes]] | None = None  # loaded with the first lookup
        self._new: dict[str, tuple[Key, bytes, int]] = {}  # ... and when it was listed (time.monotonic_ns)
        self._gone: set[str] = set()
        self._listed = 0  # bytes of names the lookups went through, kept or listed

    def _rel(self, path: str) -> str | None:
        """`path` relative to the root ("." for the root: a Triton cache's keys lie in it), None outside."""
        if path.rstrip("/") == self.root:
            return "."
        base = self.root if self.root.endswith("/") else self.root + "/"
        return path[len(base):] if path.startswith(base) and len(path) > len(base) else None

    def starting(self, path: str, prefix: str) -> list[str]:
        """The names in the directory `path` (below the root) that start with `prefix`, as os.listdir
        would give them (in no set order). OSError when it cannot be listed."""
        rel = self._rel(path)
        if rel is None:
            return [n for n in fsread.listdir(path) if n.startswith(prefix)]
        listed = time.monotonic_ns()  # before the directory is looked at (see save)
        try:
            fd = fsread.open_path(path, _DIR_FLAGS)
        except FileNotFoundError:
            self._gone.add(rel)  # its kept listing, if any, is dropped (save)
            raise
        try:
            st = os.fstat(fd)
            key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
            if self._kept is None:
                self._kept = _parse(state.read_index_file(self.root, KIND, MAX_BYTES))
            got = self._kept.get(rel)
            if got is not None and got[0] == key:
                self._listed += len(got[1])
                return _starting(got[1], prefix)
            names = os.listdir(fd)
        finally:
            os.close(fd)
        joined = b"/".join(map(os.fsencode, names))
        self._new[rel] = (key, joined, listed)
        self._listed += len(joined)
        return [n for n in names if n.startswith(prefix)]

    def save(self) -> None:
        """Keep the listings read anew whose directory had not changed for RACY_SECONDS before they were
        read (merged with the kept ones; those of directories found gone are dropped), when the lookups
        went through MIN_BYTES of names or more. Never raises."""
        kept = self._kept or {}
        gone = {rel for rel in self._gone if rel in kept}  # a directory that never was one is no change
        if not self._new and not gone or self._listed < MIN_BYTES:
            return
        made = state.start_index_write(self.root)
        if made is None:
            return
        dfd, tmp, now = made
        since = time.monotonic_ns()  # `now` (the file system's) less the time since each listing
        racy = int(RACY_SECONDS * 1e9)
        new = {rel: (key, names) for rel, (key, names, listed) in self._new.items()
               if max(key[2], key[3]) < now - (since - listed) - racy}
        self._new.clear()
        self._gone.clear()
        if not new and not gone:
            state.finish_index_write(dfd, tmp, None, KIND)
            return
        records = {rel: v for rel, v in kept.items() if rel not in gone}
        records.update(new)
        data = _dump(records)
        state.finish_index_write(dfd, tmp, data if len(data) <= MAX_BYTES else None, KIND)
        self._kept = records  # what the file holds now, for this process's next lookups


_OF: dict[str, DirNames] = {}


def of(root: str | os.PathLike) -> DirNames:
    """The DirNames of `root` for this process (made at the first lookup in it)."""
    key = os.fspath(root).rstrip("/") or "/"
    kept = _OF.get(key)
    if kept is None:
        kept = _OF[key] = DirNames(key)
    return kept


def _starting(joined: bytes, prefix: str) -> list[str]:
    """The names in `joined` (names joined by "/") that start with `prefix` (bytes.find: a scan at memory
    speed, where a pattern that looks behind each position is ten times slower)."""
    if not joined:
        return []
    if not prefix:
        return [os.fsdecode(n) for n in joined.split(b"/")]
    if "/" in prefix or "\0" in prefix:  # no name holds one
        return []
    p = os.fsencode(prefix)
    found = []
    i = 0 if joined.startswith(p) else joined.find(b"/" + p)
    while i != -1:
        start = i + 1 if joined[i:i + 1] == b"/" else i
        end = joined.find(b"/", start)
        if end == -1:
            end = len(joined)
        found.append(os.fsdecode(joined[start:end]))
        i = joined.find(b"/" + p, end)
    return found
