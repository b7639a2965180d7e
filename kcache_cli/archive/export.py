"""Export: the entries a filter selects, judged and read once each, written as a tar stream of
independently compressed parts (by forked workers on big caches), the manifest first."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import io
import json
import os
import platform
import signal
import stat
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from operator import attrgetter
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple

from kcache_cli import __version__
from kcache_cli.archive.manifest import (
    BIG_FILE,
    CONTROL_CHARS,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_NAME,
    MAX_NAME_DEPTH,
    EntryRecord,
    FileInfo,
    compression_for,
    entry_path_problem,
    is_binary_name,
    is_lock_name,
    layout_of,
    link_problem,
)
from kcache_cli.archive import stdio
from kcache_cli.catalog.scan import narrowed_by_names, scan_cache
from kcache_cli.fs import read as fsread
from kcache_cli.fs import readmarks
from kcache_cli.fs import state
from kcache_cli.fs import tarstream as ts
from kcache_cli.fs import write as fswrite
from kcache_cli.fs.locking import leftover_live, try_flock
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.fs.read import TreeTooDeep, open_regular
from kcache_cli.model.records import (BUILDING, COMPLETE, MOVED, Entry, EntryKey, Judgement, Keyed, ScanFilter, Status,
                                      Warn, entry_with, iso, unmeasured)
from kcache_cli.ops.verify import judge_open, not_judged
from kcache_cli.util import jsonout, parallel
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.interrupts import TermAsInterrupt
from kcache_cli.util.progress import NO_PROGRESS, Progress
from kcache_cli.util.signing import signer
from kcache_cli.util.units import is_digits, plural

if TYPE_CHECKING:
    from kcache_cli.layouts.base import Facts


@dataclass(frozen=True)
class ExportedEntry(Keyed):
    """One entry written into the archive: its key, verdict, files, size and build facts."""

    key: EntryKey
    status: Status
    files: int
    size: int
    compiler: str | None
    arch: str | None
    platform: str | None
    omitted: tuple[str, ...] = ()

    def to_json(self) -> dict:
        """An entry of `export --json`'s "exported" (its status is not part of it: exported ones are complete)."""
        return {**self.key.to_json(), "file_count": self.files, "size": self.size,
                "compiler": self.compiler, "arch": self.arch, "platform": self.platform, "omitted": list(self.omitted)}


@dataclass(frozen=True)
class ExportResult:
    """What `kcache export` wrote: the archive, its entries, and those left out with why."""

    archive: str
    compression: str
    entries: tuple[ExportedEntry, ...]
    left_out: tuple[tuple[Entry, str], ...]
    files: int
    size: int
    archive_size: int
    sources_only: bool
    warned: frozenset[str] = frozenset()  # the relpaths of those left out already said as warnings (skipped)

    def to_json(self, root: str) -> dict:
        """`export --json`; `root` is the cache exported from; `archive` is null when none was written."""
        return {"archive": self.archive or None, "root": root, "compression": self.compression,
                "sources_only": self.sources_only, "entry_count": len(self.entries), "file_count": self.files,
                "size": self.size, "archive_size": self.archive_size,
                "exported": [e.to_json() for e in self.entries],
                "left_out": [{"relpath": e.relpath, "status": e.status, "reason": why} for e, why in self.left_out]}


class EmptyExport(KcacheError):
    """Nothing to export (nothing selected, or every selected entry left out): no archive is written (an
    empty one is refused). `result` says what was left out and why (its `archive` is ""). The CLI's
    export takes it as nothing to do (exit 0, a warning); a push, as an error."""

    def __init__(self, message: str, result: ExportResult) -> None:
        super().__init__(message)
        self.result = result


# ---- export --------------------------------------------------------------------------------------

PARALLEL_MIN_ENTRIES = 1000  # below this, forking workers costs more than it saves
ENTRIES_PER_PART = 500
MAX_PARTS = 16
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK  # O_NONBLOCK: a fifo never blocks


@dataclass
class ExportPlan:
    """What to export: the entries the filter's names select, as the cheap scan found them, sorted by
    path. The export's workers judge each one deeply (the one judgement, as verify's) and leave out
    what is not fit to ship; entries brought along because selected ones use them (`along`: a tilus
    script's programs) go unless they are being built."""

    root: Path
    flt: ScanFilter
    sources_only: bool
    jobs: list[Entry]
    left: list[tuple[Entry, str]]
    last_used: dict[str, float] = field(default_factory=dict)
    along: frozenset[str] = frozenset()  # relpaths of the entries brought along


def _leave_out(e: Entry, flt: ScanFilter, sources_only: bool) -> str | None:
    """Why a selected entry stays out of an archive, or None."""
    if unmeasured(e) and not e.hash:  # a directory of entries the scan could not list, not a stray one
        return f"{e.reason}: none of them is exported"
    if entry_path_problem(e.layout, e.kind, e.relpath):
        return "a temp, staging or stray directory, not an entry"
    if e.status == BUILDING:
        return f"being built ({e.reason})"
    if not flt.statuses and e.status != COMPLETE:
        return f"{e.status}: {e.reason} (select it with --status {e.status})"
    if sources_only and e.kind in layout_of(e.layout).binary_kinds:
        return "holds only a binary (--sources-only)"
    return None


def plan_export(root: Path, flt: ScanFilter, warn: Warn | None = None, sources_only: bool = False) -> ExportPlan:
    """The entries `flt` selects for export. Without a --status filter only complete entries go;
    entries in flight never do. Entries that selected ones use come along (Layout.uses: the programs
    tilus scripts link to)."""
    root = Path(root)
    if not fsread.is_dir(root):
        raise KcacheError(f"no cache at {root}")
    warn = warn or (lambda m: None)
    # Statuses are judged deeply later; entries unchanged since the last scan are listed from the index
    # (and the index is kept up to date), as `ls` lists them.
    jobs = list(scan_cache(root, replace(flt, statuses=()), warn, use_index=True).entries)
    left: list[tuple[Entry, str]] = []
    along = _brought_along(root, jobs, left, warn)
    jobs += along
    jobs.sort(key=lambda e: e.relpath)
    return ExportPlan(root, flt, sources_only, jobs, left, state.load_last_used(root),
                      frozenset(e.relpath for e in along))


def _brought_along(root: Path, chosen: list[Entry], left: list, warn: Warn) -> list[Entry]:
    """The entries chosen ones use (Layout.uses) that are not chosen themselves: looked up by their paths
    (only those are judged), not found by a second scan of their layout."""
    have = {e.relpath for e in chosen}
    need: dict[str, set[str]] = {}  # layout -> relpaths
    for e in chosen:
        for rel in layout_of(e.layout).uses(root, e):
            if rel not in have:
                need.setdefault(e.layout, set()).add(rel)
    out = []
    for layout, rels in sorted(need.items()):
        wanted = narrowed_by_names(root, ScanFilter(layouts=(layout,), paths=tuple(sorted(rels))))
        for e in scan_cache(root, wanted, warn).entries:
            if e.relpath in rels:
                if e.status == BUILDING:
                    left.append((e, f"being built ({e.reason})"))
                else:
                    out.append(e)
    return out


class _Skip(Exception):
    """This entry cannot be exported as it is (a warning, not an error)."""


def _read_tree(dfd: int, prefix: str, out: list, budget: list[int],
               held: dict[str, tuple[int, int, int, bytes]] | None = None,
               top: dict[str, os.stat_result] | None = None) -> None:
    """Everything under an open directory, sorted, depth first, as (name, kind, size, mode, mtime,
    extra): kind 'file' (extra: its bytes, or None past BIG_FILE or the memory budget), 'dir',
    'link' (extra: its target) or 'other'. Types come from the directory listing; each file is
    opened once (relative to its directory's fd, never following a link), fstat'ed and read whole.
    `held`: each file read whole, by name, as (inode, size, mtime_ns, bytes) (EntryDir.held). `top`:
    the lstat of each name directly in `dfd` but its directories (a file's: the fstat of what was read).
    Iterative, at most MAX_NAME_DEPTH deep (deeper: fsread.TreeTooDeep, an OSError)."""
    stack: list[tuple[int, str, list]] = [(dfd, prefix, _listing(dfd))]
    seen = top if top is not None else {}
    try:
        while stack:
            fd, pre, items = stack[-1]
            if not items:
                stack.pop()
                if fd != dfd:
                    os.close(fd)
                continue
            de = items.pop()
            name = pre + de.name
            if de.is_file(follow_symlinks=False):
                member, st = _read_member(fd, de.name, name, budget, held)
                out.append(member)
                if fd == dfd:
                    seen[de.name] = st
            elif de.is_dir(follow_symlinks=False):
                if len(stack) >= MAX_NAME_DEPTH:  # import refuses deeper names: do not ship them
                    raise TreeTooDeep(errno.ELOOP, f"directories nested more than {MAX_NAME_DEPTH} deep")
                sub = os.open(de.name, fsread.DIR_FLAGS, dir_fd=fd)
                try:
                    out.append((name, "dir", 0, 0o755, os.fstat(sub).st_mtime, None))
                    stack.append((sub, name + "/", _listing(sub)))
                except BaseException:
                    os.close(sub)
                    raise
            elif de.is_symlink():
                st = de.stat(follow_symlinks=False)
                out.append((name, "link", st.st_size, st.st_mode, st.st_mtime, os.readlink(de.name, dir_fd=fd)))
                if fd == dfd:
                    seen[de.name] = st
            else:
                out.append((name, "other", 0, 0, 0.0, None))
                if fd == dfd:
                    try:
                        seen[de.name] = de.stat(follow_symlinks=False)
                    except FileNotFoundError:  # gone since the listing: not in the directory now
                        pass
    finally:
        for fd, _, _ in stack:
            if fd != dfd:
                os.close(fd)


def _listing(dfd: int) -> list:
    """A directory's entries, sorted by name and reversed (popped from the end in order)."""
    with os.scandir(dfd) as it:
        return sorted(it, key=_by_name, reverse=True)


def _read_member(dfd: int, base: str, name: str, budget: list[int],
                 held: dict[str, tuple[int, int, int, bytes]] | None = None) -> tuple[tuple, os.stat_result]:
    """One regular file of _read_tree: (name, "file", size, mode, mtime, bytes or None), or
    "other" when it is no longer a regular file; kept in `held` when read whole. With its fstat."""
    fd = fsread.open_quietly(base, _FILE_FLAGS, dfd)  # an export is no use of the entry: atime stays
    try:
        st = os.fstat(fd)
        mode = st.st_mode
        if not stat.S_ISREG(mode):  # replaced since the listing
            return (name, "other", 0, mode, st.st_mtime, None), st
        size = st.st_size
        data = None
        if size <= BIG_FILE and size <= budget[0]:
            data = _read_up_to(fd, size)
            budget[0] -= len(data)
            if held is not None and len(data) == size:
                held[name] = (st.st_ino, size, st.st_mtime_ns, data)
            size = len(data)
        return (name, "file", size, mode, st.st_mtime, data), st
    finally:
        fsread.close_read(fd)


ENTRY_BUDGET = 256 << 20  # bytes of one entry held in memory; the rest is read again when written


_by_name = attrgetter("name")


def _read_file(dfd: int, name: str, size: int) -> bytes:
    fd, _ = open_regular(name, dir_fd=dfd)  # read again: it must still be a regular file, not followed
    try:
        return _read_up_to(fd, size)
    finally:
        fsread.close_read(fd)


def _read_up_to(fd: int, size: int) -> bytes:
    """`size` bytes from `fd`, fewer when the file ends first (short reads happen on some filesystems)."""
    data = os.read(fd, size) if size else b""
    while len(data) < size:
        more = os.read(fd, size - len(data))
        if not more:
            break
        data += more
    return data


class _Read(NamedTuple):
    """An entry's tree as _read_tree read it, or the error that stopped the read."""

    items: list
    mtime: float
    held: dict[str, tuple[int, int, int, bytes]]
    error: OSError | None
    top: dict[str, os.stat_result]  # the lstat of each name in the entry's directory but its subdirectories


def _read_entry(d: EntryDir) -> _Read:
    """Everything in the entry directory held open as `d` (_read_tree), with the bytes of each file read
    whole kept by name for its judgement (EntryDir.held), and its listing (EntryDir.listed)."""
    items: list = []
    held: dict[str, tuple[int, int, int, bytes]] = {}
    top: dict[str, os.stat_result] = {}
    if d.fd is None:
        return _Read(items, 0.0, held, d.error or FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT)), top)
    try:
        mtime = os.fstat(d.fd).st_mtime
        _read_tree(d.fd, "", items, [ENTRY_BUDGET], held, top)
    except OSError as exc:
        return _Read([], 0.0, {}, exc, {})
    return _Read(items, mtime, held, None, top)


class _PartWriter:
    """Turns entries into tar members and manifest records (one worker, one or more parts)."""

    def __init__(self, plan: ExportPlan, writer, targets: set[str], advance: Callable[[int], None],
                 caller_reads: bool = False) -> None:

        self.plan = plan
        self.writer = writer
        self.targets = targets  # relpaths of the entries in the archive (links may point at them)
        self.advance = advance
        self.caller_reads = caller_reads  # judged deep without reading the bytes this writer reads anyway
        self.sha256 = hashlib.sha256
        self.records: list[EntryRecord] = []
        self.done: list[ExportedEntry] = []
        self.left: list[tuple[Entry, str]] = []
        self.skipped: list[tuple[str, str]] = []  # (relpath, why) of those in `left` the reads skipped: warnings
        self.files = self.size = 0
        self._anchor: fsread.Anchor | None = None

    def job(self, e: Entry) -> None:
        if self._anchor is None or self._anchor.fd < 0:  # the root held open, as ScanContext.anchor holds it
            self._anchor = fsread.anchor(self.plan.root)
        try:
            with EntryDir.open(e.path, self._anchor) as d:
                self._entry(e, d)
        except _Skip as exc:
            entry, why = exc.args
            self.left.append((entry, why))
            self.skipped.append((entry.relpath, why))
        self.advance(1)

    def _entry(self, e: Entry, d: EntryDir) -> None:
        """Read the entry held open as `d`, judge it deeply from the bytes read (the one judgement, as
        verify's: what is judged is what ships), then append it when it goes."""
        if e.relpath in self.plan.along:  # used by a chosen entry: it goes unless it is being built
            if e.status == BUILDING:
                self.left.append((e, f"being built ({e.reason})"))
            else:
                self._ship(e, d, _read_entry(d))
            return
        kept = not_judged(e, d)  # no layout judges it: its scan status decides, and nothing need be read
        if kept is not None:
            chosen = self._chosen(e, kept)
            if chosen is not None:
                self._ship(chosen, d, _read_entry(d))
            return
        read = _read_entry(d)
        d.held = read.held
        if read.error is None:
            d.listed(read.top)  # judged from the listing read for the archive: not listed again
        chosen = self._chosen(e, judge_open(e, d, True, caller_reads=self.caller_reads))
        if chosen is not None and d.held_changed:  # judged from other bytes than those read for the archive
            raise _Skip(chosen, "it changed while it was being read (written to again?)")
        if chosen is not None:
            self._ship(chosen, d, read)

    def _ship(self, e: Entry, d: EntryDir, read: _Read) -> None:
        if read.error is not None or d.fd is None:
            raise _Skip(e, f"unreadable: {read.error.strerror if read.error else 'not open'}")
        self._emit(e, d.fd, read.items, read.mtime)

    def _chosen(self, e: Entry, verdict: Judgement) -> Entry | None:
        """`e` with its deep `verdict`, or None when it stays out."""
        status, reason = verdict.status, verdict.reason
        if status == MOVED and status not in self.plan.flt.statuses and layout_of(e.layout).relocates:
            # whole, its recorded paths lead into another root: import rewrites them (Layout.relocate); a
            # layout that cannot be relocated (torch extensions) ships a moved entry only when asked for
            status, reason = COMPLETE, None
        if status != e.status or reason != e.reason:
            e = entry_with(e, status=status, reason=reason)
        if not self.plan.flt.matches(e):
            return None
        why = _leave_out(e, self.plan.flt, self.plan.sources_only)
        if why:
            self.left.append((e, why))
            return None
        return e

    def _emit(self, e: Entry, dfd: int, items: list, mtime: float) -> None:
        """Check the listing, then read and append the entry. Its members are collected first, so
        that an entry that changes under us is skipped whole (entries above BIG_FILE stream)."""
        rel = e.relpath
        fact_files = frozenset(layout_of(e.layout).fact_files)  # read for the compiler, arch, platform
        self._check_listing(e, items)
        sources_only = self.plan.sources_only
        sha256 = self.sha256
        file_header, padding = ts.file_header, ts.padding
        pieces = [ts.dir_header(rel, mtime)]
        put = pieces.append
        files: dict[str, FileInfo] = {}
        links: dict[str, str] = {}
        dirs: list[str] = []
        locks: list[str] = []
        omitted: list[str] = []
        small: dict[str, bytes] = {}
        size = 0
        streamed = False
        prefix = rel + "/"
        for name, kind, fsize, mode, ftime, extra in items:
            if kind == "file":
                if name.endswith("lock") and is_lock_name(name):
                    locks.append(name)
                    continue
                if sources_only and is_binary_name(name):
                    omitted.append(name)
                    continue
                if fsize > BIG_FILE:
                    files[name] = self._emit_big(e, dfd, name, prefix + name, fsize, mode, ftime, pieces, streamed)
                    streamed = True
                    size += fsize
                    continue
                data = extra
                if data is None:
                    data = self._read_small(e, dfd, name, fsize, streamed)
                n = len(data)
                put(file_header(prefix + name, n, mode, ftime))
                put(data)
                put(padding(n))
                files[name] = (n, sha256(data).hexdigest())
                size += n
                if name in fact_files:
                    small[name] = data
            elif kind == "dir":
                dirs.append(name)
                put(ts.dir_header(prefix + name, ftime))
            else:
                links[name] = extra
                put(ts.symlink_header(prefix + name, extra, ftime))
        if pieces:
            self.writer.write(b"".join(pieces))
        self._record(e, small, files, links, dirs, locks, omitted, size)

    def _emit_big(self, e: Entry, dfd: int, name: str, member: str, fsize: int, mode: int, ftime: float,
                  pieces: list[bytes], streamed: bool) -> FileInfo:
        """Stream a file above BIG_FILE into the archive, after the entry's members collected so far
        (from the first such file on, members go straight to the writer)."""
        if not streamed:
            self.writer.write(b"".join(pieces))
            pieces.clear()
        try:
            return self._stream(dfd, name, member, fsize, mode, ftime)
        except OSError as exc:  # members of the entry are already written: the export stops
            raise KcacheError(f"cannot read {e.path}/{name}: {exc.strerror} (the entry changed "
                              "during the export)") from None

    def _read_small(self, e: Entry, dfd: int, name: str, fsize: int, streamed: bool) -> bytes:
        """A small file's bytes; unreadable, it skips the entry (_Skip), or stops the export once
        members of the entry are already written."""
        try:
            return _read_file(dfd, name, fsize)
        except OSError as exc:
            if streamed:
                raise KcacheError(f"cannot read {e.path}/{name}: {exc.strerror} (the entry changed "
                                  "during the export)") from None
            raise _Skip(e, f"cannot read {name}: {exc.strerror} (changed during the export?)") from None

    def _check_listing(self, e: Entry, items: list) -> None:
        """Names the import would refuse and members that cannot be shipped skip the entry (_Skip)."""
        rel = e.relpath
        if not rel.isascii():  # an op directory named in another encoding: skipped, the rest still ships
            try:
                rel.encode("utf-8")
            except UnicodeEncodeError:
                raise _Skip(e, "its path is not UTF-8 (archives name files in UTF-8)") from None
        if not rel.isprintable() and CONTROL_CHARS.search(rel):
            raise _Skip(e, "its path holds control characters (import would refuse the archive)")
        for name, kind, _, _, _, extra in items:
            if not name.isprintable() and CONTROL_CHARS.search(name):  # import would refuse the archive
                raise _Skip(e, f"{name!r} holds control characters")
            if kind == "file":
                if not name.isascii():
                    try:
                        name.encode("utf-8")
                    except UnicodeEncodeError:
                        raise _Skip(e, f"{name!r} is not a UTF-8 file name") from None
                continue
            if kind == "other":
                raise _Skip(e, f"{name} is a device, fifo or socket")
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise _Skip(e, f"{name!r} is not a UTF-8 file name") from None
            if kind == "link":
                bad = link_problem(e.layout, e.kind, rel, name, extra, self.targets.__contains__)
                if bad:
                    raise _Skip(e, bad)

    def _record(self, e: Entry, small: dict[str, bytes], files: dict[str, FileInfo], links: dict[str, str],
                dirs: list[str], locks: list[str], omitted: list[str], size: int) -> None:
        """The entry's manifest record and its line in the result."""
        facts = _entry_facts(e, small, (*files, *omitted))
        self.records.append(EntryRecord(e.key, files, links, tuple(dirs), tuple(locks), e.status,
                                        facts.compiler, facts.arch, facts.platform,
                                        tuple(omitted) if self.plan.sources_only else None,
                                        last_used=e.last_used))
        self.done.append(ExportedEntry(e.key, e.status, len(files), size, facts.compiler, facts.arch,
                                       facts.platform, tuple(omitted)))
        self.files += len(files)
        self.size += size

    def _stream(self, dfd: int, name: str, member: str, size: int, mode: int, mtime: float) -> FileInfo:

        fd, _ = open_regular(name, dir_fd=dfd)  # read again: it must still be a regular file, not followed
        write = self.writer.write
        h = self.sha256()
        try:
            write(ts.file_header(member, size, mode, mtime))
            left = size
            while left:
                chunk = os.read(fd, min(ts.CHUNK, left))
                if not chunk:
                    raise KcacheError(f"{member} shrank while it was being exported")
                h.update(chunk)
                write(chunk)
                left -= len(chunk)
        finally:
            fsread.close_read(fd)
        write(ts.padding(size))
        return size, h.hexdigest()


def _entry_facts(entry: Entry, small: dict[str, bytes], names: Iterable[str]) -> Facts:
    """The compiler, arch and platform of an entry, as its layout finds them (Layout.facts)."""
    return layout_of(entry.layout).facts(entry, small, names)


@dataclass
class _WorkerOutput:
    """What an export worker sends back."""

    records: str  # its manifest records as JSON text, joined by commas
    done: list[ExportedEntry]
    left: list[tuple[Entry, str]]
    files: int
    size: int
    sizes: list[int]  # of its parts, compressed
    counts: list[int]  # entries in each part
    skipped: list[tuple[str, str]]  # (relpath, why): left out as they were read, said as warnings
    moved: list[tuple[str, int, int, int]]  # the atimes its reads moved (readmarks.take_moved), noted by the command


def _export_worker(plan: ExportPlan, parts: list[list], body_fd: int, compression: str, targets: set[str],
                   advance: Callable[[int], None], abort: Callable[[], bool]) -> _WorkerOutput:
    """Write `parts` (lists of jobs) into the temp file open as `body_fd` (never reopened by its path),
    one compressed part after the other."""
    with os.fdopen(os.dup(body_fd), "wb") as out:
        writer = ts.FrameWriter(out, compression)
        pw = _PartWriter(plan, writer, targets, advance, caller_reads=True)  # it reads every byte it judged
        sizes, counts = [], []
        try:
            start = 0
            for jobs in parts:
                before = len(pw.records)
                for job in jobs:
                    if abort():
                        raise parallel.Aborted("export aborted")
                    pw.job(job)
                end = writer.end_part()
                sizes.append(end - start)
                counts.append(len(pw.records) - before)
                start = end
        finally:
            writer.close()
    # The records travel back as JSON text: encoding them here is done in parallel, and a string
    # pickles much faster than the records (orjson: a tenth of json.dumps's time).

    sign = signer()  # the node's key signs every record, when it has one (kcache remote keygen)
    docs = [r.to_json() for r in pw.records]
    text = jsonout.encode(docs if sign is None else [sign.sign(d) for d in docs]).decode("ascii")[1:-1]
    return _WorkerOutput(text, pw.done, pw.left, pw.files, pw.size, sizes, counts, pw.skipped,
                         readmarks.take_moved())


def export_archive(plan: ExportPlan, archive: str, *, warn: Warn | None = None,
                   progress: Progress | None = None) -> ExportResult:
    """Write the planned entries into `archive` (compression from its name) through a temp file
    renamed at the end: a failed export leaves no half archive behind.

    The tar stream is `manifest.json`, then the entries in parts (independent gzip members or zstd
    frames, listed in the manifest with their sizes) written by forked workers on big caches."""
    compression = compression_for(archive)
    archive = os.path.abspath(archive)
    out_dir = os.path.dirname(archive)
    if not os.path.isdir(out_dir):
        raise UsageError(f"cannot write {archive}: {out_dir} is not a directory")  # a typo: exit 2
    root = os.path.realpath(plan.root)
    if os.path.commonpath([os.path.realpath(out_dir), root]) == root:
        # its temp files would land in an entry (read into the archive itself) or among the cache's own
        raise UsageError(f"cannot write {archive}: it lies inside the cache it exports ({plan.root}); write it "
                         "outside the cache")
    warn = warn or (lambda m: None)
    made = archive_time()
    jobs = plan.jobs
    targets = {j.relpath for j in jobs}  # what links may point at, besides their own entry
    workers, per_worker = _share_out(jobs)
    if progress:
        progress.start(len(jobs))
    _collect_stale_temps(out_dir)
    temps: list[str] = []
    held: list[int] = []  # flocks on our temp files, held to the end: prune and later exports leave them be
    signals = TermAsInterrupt()
    try:
        _make_temps(archive, workers + 1, temps, held)
        final_tmp, bodies = temps[0], temps[1:]

        def run(w: int, advance, abort):
            return _export_worker(plan, per_worker[w], held[w + 1], compression, targets, advance, abort)

        results, _ = parallel.run_phased(workers, run, progress)
        m = _merge(results, plan.left, warn)
        readmarks.save(plan.root)
        # The end-of-archive blocks close the last part; no part is empty (import checks that).
        with os.fdopen(os.dup(held[-1]), "ab") as last:
            tail = ts.FrameWriter(last, compression)
            tail.write(ts.END_OF_ARCHIVE)
            m.sizes[-1] += tail.close()
        if not m.done:  # an empty archive is refused: nothing is written (the temp files go below)
            raise empty_export(plan.root, m.left, compression, plan.sources_only, frozenset(m.warned))
        _write_final(held[0], bodies, compression, _manifest(plan, m, made), m.records, made)
        signals.check()  # one a finalizer swallowed: the archive is not published
        _rename_beside(final_tmp, archive)
    finally:
        _unlink_all(temps)
        _close_all(held)
        signals.restore()
    return ExportResult(archive, compression, tuple(m.done), tuple(m.left), m.files, m.size,
                        os.path.getsize(archive), plan.sources_only, frozenset(m.warned))


def export_to_stream(plan: ExportPlan, fd: int = 1, *, warn: Warn | None = None,
                     progress: Progress | None = None) -> ExportResult:
    """export_archive (zstd) made in a private temp directory (stdio.private_dir), then copied to `fd`
    (standard output: `export -`, archive/stdio.py); the temp directory goes either way. Its result's
    archive is "-"."""
    stdio.refuse_terminal(fd, "export -")
    with stdio.private_dir("kcache-export-") as where:
        try:
            result = export_archive(plan, os.path.join(where, "archive.tar.zst"), warn=warn, progress=progress)
        except OSError as exc:
            if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                raise
            raise KcacheError(f"no room for the archive in {tempfile.gettempdir()} ({exc.strerror}): export - "
                              "makes it there before it copies it out; set TMPDIR to a disk with room for it, "
                              "nothing was written to standard output") from None
        size = stdio.copy_out(result.archive, fd)
    return replace(result, archive=stdio.STDIO, archive_size=size)


def _share_out(jobs: list) -> tuple[int, list[list[list]]]:
    """How many workers export `jobs`, and each worker's parts (lists of jobs): one part per
    ENTRIES_PER_PART entries (at most MAX_PARTS), one worker and one part on a small export."""
    n_parts = max(1, min(MAX_PARTS, len(jobs) // ENTRIES_PER_PART))
    workers = min(parallel.cpus(), n_parts) if len(jobs) >= PARALLEL_MIN_ENTRIES else 1
    if workers == 1:
        n_parts = 1
    return workers, parallel.split(parallel.split(jobs, n_parts), workers)


@dataclass
class _Merged:
    """The workers' outputs put together, in worker order."""

    records: list[str] = field(default_factory=list)  # each worker's records, JSON text
    done: list[ExportedEntry] = field(default_factory=list)
    left: list[tuple[Entry, str]] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)
    files: int = 0
    size: int = 0
    warned: set[str] = field(default_factory=set)


def _merge(results: list[_WorkerOutput], left: Iterable[tuple[Entry, str]], warn: Warn) -> _Merged:
    """Put the workers' outputs together after the plan's `left`, passing on their warnings."""
    m = _Merged(left=list(left))
    for r in results:
        if r.records:
            m.records.append(r.records)
        m.done += r.done
        m.left += r.left
        m.sizes += r.sizes
        m.counts += r.counts
        m.files += r.files
        m.size += r.size
        for rel, why in r.skipped:
            warn(f"skipping {rel}: {why}")
            m.warned.add(rel)
    readmarks.put_moved([x for r in results for x in r.moved])  # what their reads of others' files moved: no use
    return m


def empty_export(root: Path | str, left: list[tuple[Entry, str]], compression: str, sources_only: bool,
                 warned: frozenset[str] = frozenset()) -> EmptyExport:
    """The one "nothing to export" (no archive written): what was selected and left out, and why (`warned`:
    those of `left` already said as warnings)."""
    if not left:
        why = f"no entries in {root} match the selection"
    else:
        why = (f"{plural(len(left), 'entry')} selected, none fit to ship "
               f"(first: {left[0][0].relpath}: {left[0][1]})")
    return EmptyExport(f"nothing to export: {why}; no archive written",
                       ExportResult("", compression, (), tuple(left), 0, 0, 0, sources_only, warned))


def archive_time() -> float:
    """When the archive (or an image, oci push) is made, for what it holds that is no file's own time (the
    manifest's `created` and its tar header; an image's config and manifest): SOURCE_DATE_EPOCH when set
    (reproducible-builds.org), so that two exports or pushes of an unchanged cache are the same bytes; else
    now. A malformed value is a usage error, as the convention asks, and so is one past 9999-12-31 (ISO-8601's
    four-digit years; a tar header's octal time and the platform's time_t end near there too)."""
    text = os.environ.get("SOURCE_DATE_EPOCH", "")
    if not text:
        return time.time()
    if not is_digits(text) or len(text) > 12 or int(text) > _LAST_SECOND:
        raise UsageError(f"SOURCE_DATE_EPOCH={text[:40]!r} is not a whole number of seconds since 1970 up to "
                         f"{_LAST_SECOND} (9999-12-31, reproducible-builds.org): set it to one, or unset it")
    return float(int(text))


_LAST_SECOND = 253402300799  # 9999-12-31T23:59:59Z


def _manifest(plan: ExportPlan, m: _Merged, made: float) -> dict:
    """The archive's manifest.json, without its entry records; `made`: archive_time()."""
    return {
        "format": FORMAT, "format_version": FORMAT_VERSION, "kcache_version": __version__,
        "created": iso(made), "platform": _platform(), "sources_only": plan.sources_only,
        "totals": {"entries": len(m.done), "files": m.files, "size": m.size},
        "parts": [{"size": s, "entries": c} for s, c in zip(m.sizes, m.counts)],
    }


def _write_final(final_fd: int, bodies: list[str], compression: str, manifest: dict, records: list[str],
                 made: float) -> None:
    """The archive: the manifest (its entry records already JSON text, joined; its header dated `made`), then
    every part."""
    head_json = json.dumps(manifest, separators=(",", ":"))
    data = (head_json[:-1] + ',"entries":[' + ",".join(records) + "]}").encode()
    with os.fdopen(os.dup(final_fd), "wb") as final:
        head = ts.FrameWriter(final, compression)
        head.write(ts.file_header(MANIFEST_NAME, len(data), 0o644, made))
        head.write(data)
        head.write(ts.padding(len(data)))
        head.close()
        for body in bodies:
            _append_file(final, body)
        os.fchmod(final.fileno(), 0o666 & ~fswrite.umask())  # mkstemp makes 0600; an archive is a file the user makes


def _rename_beside(tmp: str, archive: str) -> None:
    """Rename the finished temp file to the archive, both names in one held directory descriptor."""
    fd = os.open(os.path.dirname(archive) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fswrite.rename_at(fd, os.path.basename(tmp), fd, os.path.basename(archive))
    finally:
        os.close(fd)


def _append_file(out, path: str) -> None:
    out.flush()
    with open(path, "rb") as src:
        size = os.fstat(src.fileno()).st_size
        copied = 0
        try:
            while copied < size:
                n = os.copy_file_range(src.fileno(), out.fileno(), size - copied)
                if n == 0:
                    break
                copied += n
        except (AttributeError, OSError):
            src.seek(copied)
            out.seek(0, os.SEEK_END)
            import shutil

            shutil.copyfileobj(src, out, 1 << 20)


def _make_temps(archive: str, n: int, temps: list[str], held: list[int]) -> None:
    """`n` temp files beside `archive`, each flocked (the fds kept in `held`) so that a prune or a later
    export sees a live export (locking.leftover_live)."""
    out_dir = os.path.dirname(archive)
    # SIGTERM/SIGHUP unwind the export (TermAsInterrupt); one landing between mkstemp's open and the
    # append would leave a temp file nobody removes: they wait until each file is recorded.
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGHUP})
    try:
        for _ in range(n):
            fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(archive)}.", suffix=".kcache-tmp", dir=out_dir)
            held.append(fd)
            temps.append(tmp)
            fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError as exc:
        raise KcacheError(f"cannot write in {out_dir}: {exc.strerror}") from None
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _try_flock(fd: int) -> bool:
    try:
        return try_flock(fd)
    except OSError:
        return False


def _collect_stale_temps(out_dir: str) -> None:
    """Temp files of killed exports in `out_dir` (`.<archive>.*.kcache-tmp`, regular, not flocked by a
    running export): removed relative to the directory's descriptor."""
    try:
        fd = os.open(out_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for name in os.listdir(fd):
            if not state.EXPORT_TEMP.match(name):
                continue
            try:
                tfd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fd)
            except OSError:
                continue
            try:
                if leftover_live(fd, name) is False and _try_flock(tfd):
                    fswrite.unlink_at(fd, name)  # while holding its lock: no export can be using it
            except OSError:
                pass
            finally:
                os.close(tfd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink_all(paths: list[str]) -> None:
    """Our temp files (all in one directory), unlinked relative to that directory's descriptor."""
    if not paths:
        return
    try:
        fd = os.open(os.path.dirname(paths[0]) or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        for p in paths:
            try:
                fswrite.unlink_at(fd, os.path.basename(p))
            except OSError:
                pass
    finally:
        os.close(fd)


def _platform() -> str:
    return f"{sys.platform}-{platform.machine()}"


class _Capture:
    """A writer that keeps the tar bytes of one entry, for `entry_records`."""

    def __init__(self) -> None:
        self.chunks: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.chunks.append(data)


class EntryFiles(NamedTuple):
    """One entry as export writes it (`entry_records`)."""

    record: EntryRecord
    data: dict[str, bytes]  # file name -> its bytes
    executable: tuple[str, ...]  # the names of its executable files


def entry_records(plan: ExportPlan) -> Iterator[EntryFiles]:
    """Each planned entry as export writes it (its manifest record, its files' bytes, which are
    executable), judged and read exactly as by `export_archive`. Entries export would leave out
    (incomplete, changed while read...) are in `plan.left` afterwards."""
    capture = _Capture()
    pw = _PartWriter(plan, capture, {j.relpath for j in plan.jobs}, NO_PROGRESS.advance)
    for job in plan.jobs:
        capture.chunks.clear()
        before, left = len(pw.records), len(pw.left)
        pw.job(job)
        plan.left.extend(pw.left[left:])
        if len(pw.records) == before:
            continue
        record = pw.records[-1]
        reader = ts.TarReader(io.BytesIO(b"".join(capture.chunks)))
        prefix = record.relpath + "/"
        data: dict[str, bytes] = {}
        executable = []
        while (m := reader.next()) is not None:
            if m.type == ts.REGULAR:
                name = m.name[len(prefix):]
                data[name] = reader.small_data(m) or b"".join(reader.data(m))
                if m.mode & 0o111:
                    executable.append(name)
        yield EntryFiles(record, data, tuple(executable))
