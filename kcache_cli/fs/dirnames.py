"""The names in a cache's big directories, kept between commands: for lookups by hash prefix, for the
layouts' detection at a root and for the scans that list a root's entry directories.

`inspect 7ebb`, `log 7ebb`, `clear 7ebb` and the completion of a hash list every directory entries lie in
(64 op directories of a 100,000-entry hidet cache, a Triton root of 10^5 keys) to find the few names that
start with the prefix, and every command on a Triton root lists its 10^5 names to detect the layout, and a
scan once more to find the keys: listing 10^5 names costs more than the rest of a lookup. A listing changes
only with its directory: creating, removing or renaming a name in a directory sets its mtime and ctime
(POSIX), and ctime cannot be set from user space. So a listing kept with the directory's device, inode,
mtime and ctime is the listing for as long as an `fstat` of the directory, opened as a listing opens it,
gives those four again. A listing is kept only when its directory had not changed for RACY_SECONDS before
it was read (by the file system's clock, as the scan index counts it): a change within the same timestamp
tick could otherwise keep both times. Every name found this way is still checked by the caller (an lstat)
as a name found by a listing is.

Each name is kept with its type as the listing saw it (a directory, a symbolic link, anything else): a
name changes type only by being removed and made again, which changes the directory. What a link points
to is not the directory's: `dirs_and_links` asks the link each time.

Within one command a listing made anew serves the next question about the same directory when an fstat
still gives the same four and it had not changed for RACY_SECONDS before (by this process's clock): a
command that removes entries and lists again sees the removal.

The file is `<root>/.kcache/index/names.<euid>`, this user's alone (state.read_index_file: a regular file
of this user that nobody else may write; written through a temp file renamed over it), written only by
`save` (a scan's or a lookup's, never detection's: a directory that is not a cache gets nothing). Its
payload is NUL-separated fields, seven per directory: its path relative to the root, device, inode,
mtime_ns, ctime_ns, its names joined by "/" (no file name holds a NUL or a "/") and their types, one byte
each; a length and CRC-32 header guards it. A missing, foreign, truncated or garbled file means listing as
before. Light on purpose (os, struct, zlib): a lookup imports it."""

from __future__ import annotations

import os
import struct
import sys
import time
import zlib
from itertools import compress

from kcache_cli.fs import read as fsread
from kcache_cli.fs import state

KIND = "names"
MAGIC = b"KCACHE-DIR-NAMES-2\n"
_HEADER = struct.Struct("<QI")  # payload length, CRC-32 of the payload
_FIELDS = 7
RACY_SECONDS = 2.0
MIN_BYTES = 16 << 10  # a lookup that lists less (about 1,000 hashes) keeps nothing: it costs nothing to redo
MAX_BYTES = 256 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC  # as fsread.listdir opens a directory
DIR, LINK, OTHER = ord("d"), ord("l"), ord("-")  # a name's type byte
# A listing's types made selectors for itertools.compress (1: the name is of that type): the names of one
# type picked in C (a Triton root of 10^5 keys and one file: 3 ms in Python).
_IS_DIR = bytes(int(c == DIR) for c in range(256))
_IS_LINK = bytes(int(c == LINK) for c in range(256))

Key = tuple[int, int, int, int]  # device, inode, mtime_ns, ctime_ns
# Names joined by "/", where they lie: a listing made here is its own bytes (0 to their length); a kept
# one lies in the names file's bytes, never copied out of them (a hidet lookup searches 1.8 MB of names:
# copying them cost more than the search).
Names = tuple[bytes, int, int]
Listing = tuple[Key, Names, bytes]  # the directory's key, its names, their types
_NO_NAMES: Names = (b"", 0, 0)


def _parse(data: bytes | None) -> dict[str, Listing]:
    """relpath -> listing from a names file's bytes; {} for anything malformed. Each field is found by its
    NUL; the names stay where they are."""
    start = len(MAGIC) + _HEADER.size
    if not data or not data.startswith(MAGIC) or len(data) < start:
        return {}
    length, crc = _HEADER.unpack_from(data, len(MAGIC))
    if len(data) - start != length or zlib.crc32(memoryview(data)[start:]) != crc or not length:
        return {}
    out: dict[str, Listing] = {}
    pos, end = start, len(data)
    try:
        while pos < end:
            fields = []  # (start, stop) of each field
            for i in range(_FIELDS):
                stop = data.find(b"\0", pos)
                if stop == -1 and i < _FIELDS - 1:
                    return {}
                stop = end if stop == -1 else stop
                fields.append((pos, stop))
                pos = stop + 1
            (r0, r1), dev, ino, mtime, ctime, (n0, n1), (t0, t1) = fields
            if t1 - t0 != (data.count(b"/", n0, n1) + 1 if n1 > n0 else 0):
                return {}
            key = (int(data[dev[0]:dev[1]]), int(data[ino[0]:ino[1]]), int(data[mtime[0]:mtime[1]]),
                   int(data[ctime[0]:ctime[1]]))
            out[os.fsdecode(data[r0:r1])] = (key, (data, n0, n1), data[t0:t1])
    except ValueError:
        return {}
    return out


def _dump(records: dict[str, Listing]) -> bytes:
    payload = b"\0".join(b"\0".join((os.fsencode(rel), b"%d" % k[0], b"%d" % k[1], b"%d" % k[2], b"%d" % k[3],
                                     buf[s:e], types)) for rel, (k, (buf, s, e), types) in records.items())
    return MAGIC + _HEADER.pack(len(payload), zlib.crc32(payload)) + payload


def _read(fd: int) -> tuple[Names, bytes]:
    """The names in the open directory `fd` and their types (d_type: no stat), sorted by name: most
    questions want them so, and sorting names that are in order already costs a tenth."""
    listed: list[tuple[str, int]] = []
    with os.scandir(fd) as it:
        for de in it:
            listed.append((de.name, LINK if de.is_symlink() else DIR if de.is_dir(follow_symlinks=False) else OTHER))
    listed.sort()
    joined = os.fsencode("/".join([name for name, _ in listed]))
    return (joined, 0, len(joined)), bytes([t for _, t in listed])


def _split(names: Names) -> list[str]:
    buf, start, end = names
    if start == end:
        return []
    return str(memoryview(buf)[start:end], _FS_ENCODING, _FS_ERRORS).split("/")  # os.fsdecode, uncopied


_FS_ENCODING, _FS_ERRORS = sys.getfilesystemencoding(), sys.getfilesystemencodeerrors()


class DirNames:
    """The kept listings of one cache root: questions about a directory below it are answered from them
    where it is unchanged, and from a listing otherwise; `save` keeps what was listed anew. One per root
    and process (`of`): the file is read once however many steps of a command look names up."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = os.fspath(root).rstrip("/") or "/"
        self._kept: dict[str, Listing] | None = None  # loaded with the first question
        # listed anew: (listing, when by time.monotonic_ns (see save), whether this process may reuse it)
        self._new: dict[str, tuple[Listing, int, bool]] = {}
        self._gone: set[str] = set()
        self._listed = 0  # bytes of names the questions went through, kept or listed

    def _rel(self, path: str) -> str | None:
        """`path` relative to the root ("." for the root: a Triton cache's keys lie in it), None outside."""
        if path.rstrip("/") == self.root:
            return "."
        base = self.root if self.root.endswith("/") else self.root + "/"
        return path[len(base):] if path.startswith(base) and len(path) > len(base) else None

    def _listing(self, path: str, fd: int) -> tuple[Names, bytes]:
        """(names, types) of the directory `path`, open as `fd`: kept, or listed now."""
        listed, now = time.monotonic_ns(), time.time_ns()  # before the directory is looked at (see save)
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        rel = self._rel(path)
        if rel is not None:
            got = self._known(rel)
            if got is not None and got[0] == key:
                self._listed += got[1][2] - got[1][1]
                return got[1], got[2]
        names, types = _read(fd)
        if rel is not None:
            reuse = max(key[2], key[3]) < now - int(RACY_SECONDS * 1e9)
            self._new[rel] = ((key, names, types), listed, reuse)
            self._listed += names[2]
        return names, types

    def _known(self, rel: str) -> Listing | None:
        """The listing of `rel` this process made and may reuse, else the one the file keeps."""
        new = self._new.get(rel)
        if new is not None and new[2]:
            return new[0]
        if self._kept is None:
            self._kept = _parse(state.read_index_file(self.root, KIND, MAX_BYTES))
        return self._kept.get(rel)

    def _unchanged(self, path: str) -> tuple[Names, bytes] | None:
        """The kept listing of `path` when one stat of it (from its held root, following links as the
        opening does) still gives its key: one system call, where opening, fstat-ing and closing it take
        three (an Inductor cache keeps a thousand graph shards). None: list it (`_listing`)."""
        rel = self._rel(path)
        if rel is None:
            return None
        got = self._known(rel)
        if got is None:
            return None
        try:
            st = fsread.stat_path(path)
        except (OSError, ValueError):
            return None  # the opening says what is wrong, as before
        if got[0] != (st.st_dev, st.st_ino, st.st_mtime_ns, st.st_ctime_ns):
            return None
        self._listed += got[1][2] - got[1][1]
        return got[1], got[2]

    def _open(self, path: str) -> int:
        try:
            return fsread.open_path(path, _DIR_FLAGS)
        except FileNotFoundError:
            rel = self._rel(path)
            if rel is not None:
                self._gone.add(rel)  # its kept listing, if any, is dropped (save)
            raise

    def starting(self, path: str, prefix: str) -> list[str]:
        """The names in the directory `path` (below the root) that start with `prefix`, as os.listdir
        would give them (in no set order). OSError when it cannot be listed."""
        return _starting(self._names(path)[0], prefix)

    def subdirs_starting(self, path: str, prefixes: tuple[str, ...]) -> list[str]:
        """The names in `path` that start with one of `prefixes` and are real subdirectories (each lstat'ed:
        a few names of thousands, where `subdirs` decodes them all), sorted. OSError as for `starting`."""
        found = {n for p in prefixes for n in self.starting(path, p)}
        return sorted(n for n in found if fsread.is_real_dir(os.path.join(path, n)))

    def subdirs(self, path: str) -> list[str]:
        """The names of the real subdirectories of `path` (a link is not one), sorted; [] when it is
        missing, OSError when it cannot be read (fsread.subdir_names)."""
        names, types = self._typed(path)
        if types.count(DIR) == len(types):  # directories only (a Triton root): no name looked at
            return sorted(_split(names))
        return sorted(compress(_split(names), types.translate(_IS_DIR)))

    def links(self, path: str) -> list[str]:
        """The names of the symbolic links in `path`, sorted; [] when it is missing, OSError when it
        cannot be read. A directory without one answers from its types alone (no name decoded)."""
        names, types = self._typed(path)
        if types.find(LINK) == -1:
            return []
        return sorted(compress(_split(names), types.translate(_IS_LINK)))

    def _typed(self, path: str) -> tuple[Names, bytes]:
        """_names of `path`; nothing when it is missing."""
        try:
            return self._names(path)
        except FileNotFoundError:
            return _NO_NAMES, b""

    def _names(self, path: str) -> tuple[Names, bytes]:
        """(names, types) of the directory `path`: kept while unchanged, else listed now (OSError when it
        cannot be)."""
        got = self._unchanged(path)
        if got is not None:
            return got
        fd = self._open(path)
        try:
            return self._listing(path, fd)
        finally:
            os.close(fd)

    def dirs_and_links(self, path: str) -> tuple[list[str], frozenset[str]]:
        """The names of the directories in `path` and of the links in it to one (asked now), in listing
        order, and the set of those that are links. OSError when it cannot be listed."""
        listed, types = self._names(path)
        names = _split(listed)
        if types.count(DIR) == len(types):  # directories only (a Triton root of 10^5 keys): no name looked at
            return names, frozenset()
        if types.find(LINK) == -1:  # directories and files: the directories, picked in C
            return list(compress(names, types.translate(_IS_DIR))), frozenset()
        base = path.rstrip("/") + "/"
        found = [(name, t == LINK) for name, t in zip(names, types)
                 if t == DIR or t == LINK and fsread.is_dir(base + name)]
        return [name for name, _ in found], frozenset(name for name, link in found if link)

    def save(self) -> None:
        """Keep the listings read anew whose directory had not changed for RACY_SECONDS before they were
        read (merged with the kept ones; those of directories found gone are dropped), when the questions
        went through MIN_BYTES of names or more. Never raises."""
        if not self._new and not self._gone or self._listed < MIN_BYTES:
            return
        kept = self._kept if self._kept is not None else _parse(state.read_index_file(self.root, KIND, MAX_BYTES))
        gone = {rel for rel in self._gone if rel in kept}  # a directory that never was one is no change
        if not self._new and not gone:
            return
        made = state.start_index_write(self.root)
        if made is None:
            return
        dfd, fd, tmp, now = made
        since = time.monotonic_ns()  # `now` (the file system's) less the time since each listing
        racy = int(RACY_SECONDS * 1e9)
        new = {rel: listing for rel, (listing, listed, _) in self._new.items()
               if max(listing[0][2], listing[0][3]) < now - (since - listed) - racy}
        self._new.clear()
        self._gone.clear()
        if not new and not gone:
            state.finish_index_write(dfd, fd, tmp, None, KIND)
            return
        records = {rel: v for rel, v in kept.items() if rel not in gone}
        records.update(new)
        data = _dump(records)
        state.finish_index_write(dfd, fd, tmp, data if len(data) <= MAX_BYTES else None, KIND)
        self._kept = records  # what the file holds now, for this process's next questions


_OF: dict[str, DirNames] = {}


def save(root: str | os.PathLike) -> None:
    """DirNames.save of `root`'s, when this process asked about it (a scan's end). Never raises."""
    kept = _OF.get(os.fspath(root).rstrip("/") or "/")
    if kept is not None:
        kept.save()


def of(root: str | os.PathLike) -> DirNames:
    """The DirNames of `root` for this process (made at the first question about it)."""
    key = os.fspath(root).rstrip("/") or "/"
    kept = _OF.get(key)
    if kept is None:
        kept = _OF[key] = DirNames(key)
    return kept


def _starting(names: Names, prefix: str) -> list[str]:
    """The names that start with `prefix` (bytes.find, where they lie: a scan at memory speed, where a
    pattern that looks behind each position is ten times slower)."""
    buf, first, last = names
    if first == last:
        return []
    if not prefix:
        return _split(names)
    if "/" in prefix or "\0" in prefix:  # no name holds one
        return []
    p = os.fsencode(prefix)
    found = []
    i = first if buf.startswith(p, first, last) else buf.find(b"/" + p, first, last)
    while i != -1:
        start = i + 1 if buf[i:i + 1] == b"/" else i
        end = buf.find(b"/", start, last)
        if end == -1:
            end = last
        found.append(os.fsdecode(buf[start:end]))
        i = buf.find(b"/" + p, end, last)
    return found
