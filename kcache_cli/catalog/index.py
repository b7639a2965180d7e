"""An exact index of scanned entries, so that a second `ls`/`stats` on an unchanged cache skips the judging.

The index lives in `<root>/.kcache/index/scan.<euid>` (in a group-shared root, in the user's own
`.kcache/index/<euid>/`: fs/state.py open_index_dir). It is a layer around the per-entry scan
(`ScanContext.map_entries`, through which hidet's op entries, Triton's kernels, Inductor's entries,
vLLM's units, tilelang's kernels and binaries and tilus's programs are judged): each record is one entry
exactly as the scan judged it (every `Entry` field, so new fields and statuses pass through) plus a key
over the files its verdict went by, and a record is served only when a fresh `lstat` of the entry
directory and of each of those files gives the same key. Anything else sends the entry back to the real scan.

What the key covers is what the layout's judgement recorded in `ctx.recording[path]` before it read a
byte: (the directory's stat, [(name, lstat)]), names relative to the entry. `read_dir` records the
entry's files (hidet, tilelang); Triton's listing the same, and nothing when the judgement looked
outside the key directory (group paths into another root); Inductor's an aotautograd entry's files and
those of the fx graphs it names (`../../fxgraph/<xx>/<key>/...`); vLLM's and tilus's every name in the
unit's or program's tree, directories included (layouts/_common.py walk_tree). None: not stored.

The key (a BLAKE2b digest): the directory's inode, mtime and ctime (a file added, removed or renamed
changes them), and each file's inode, size, mtime and ctime. A file rewritten in place changes neither
the directory nor, with `touch -d`, its mtime or size: only its own ctime tells, and ctime cannot be set
from user space. So proving an entry unchanged takes one `lstat` per file, as many as `du` makes; what
the index saves is the directory listings, the reads (lib.so's ELF header, kcache.json) and the judging.
No cheaper signal exists in stat: nothing on a directory changes when a file in it is rewritten.

Never stale, by construction:
- the key is taken before the entry is judged (read_dir records the stats it makes anyway), so a change
  while the scan runs leaves a key that no longer matches;
- an entry changed less than RACY_SECONDS before the scan started (by the file system's own clock: the
  ctime of the temp file this scan will write the index into, less the time the scan had run by then)
  is not stored: a later change within the same timestamp tick could otherwise keep its ctime;
- a record holds what the layout's per-entry function returned (the Entry) and is served only to the
  same function with the same job: the job carries what the judgement takes from outside the entry (the
  installed hidet's version), so another installed hidet judges the entries again. One exception: a job
  that carries an op or target filter (Triton's and Inductor's: `ls --op X`, `--target cpu`), which the
  layout's `unfiltered(job)` names, is answered from the record of the same job without it, the filter
  applied to the op and target that record holds (as the judgement applies it to those of the same
  files); a filtered scan never replaces a record of another job (IndexedContext.save);
- only statuses that are a function of the entry's own files and its job are stored (STORABLE):
  `building` and `partial` depend on locks, which no stat shows, and `unreadable` on permissions; an
  entry whose scan warned, whose recorded stats leave out a subdirectory's files, or that holds a
  symlink (the judgement may read through it) is not stored either. A judgement that comes to depend
  on anything else must record it, put it in the job, add it to `_context()`, or leave STORABLE;
- the whole index is used only if it was written for the same root, user, groups, Python, kcache code
  (the judging modules' files) and Entry fields; it must be owned by the user and not writable by others;
  a truncated or garbled file fails a part's length or CRC check; loading never runs code (a pickle
  unpickler that refuses every global). Any failure means "no index": a full scan.
- writes go to a temp file in the index directory (opened relative to the root, no symlink followed)
  and are renamed over the index: readers see the old index or the new one. Concurrent writers each
  rename a consistent snapshot. Nothing is written outside `.kcache/index/`; a read-only cache simply
  has no index. No write error ever fails the command.
"""

from __future__ import annotations

import gc
import io
import os
import pickle
import struct
import sys
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from _blake2 import blake2b  # what hashlib.blake2b is, without _hashlib (OpenSSL: 2.3 ms of a start)
from importlib.util import find_spec
from stat import S_ISDIR, S_ISLNK, S_ISREG
from typing import Any

import kcache_cli
from kcache_cli.catalog.scan_context import ScanContext
from kcache_cli.fs import read as fsread
from kcache_cli.fs import readmarks
from kcache_cli.fs.state import finish_index_write, read_index_file, start_index_write
from kcache_cli.layouts import NAMES
from kcache_cli.model.records import COMPLETE, CORRUPT, ENTRY_FIELDS, ENTRY_VALUES, FAILED, STALE, Entry, entry_from

MAGIC = b"KCACHE-SCAN-INDEX-2\n"
FORMAT = 2
# After MAGIC: the number of parts, each part's (length, CRC-32), then the parts: pickles, the first of
# {"context": ..., "records": {path: Record}}, each other of more records ({path: Record}: what a worker
# process recorded, pickled there once; IndexedContext.save).
_PARTS = struct.Struct("<I")
_HEADER = struct.Struct("<QI")
_MAX_PARTS = 1024
RACY_SECONDS = 2.0
# Below this many entries a scan takes milliseconds: no index is written (nothing appears in small caches).
MIN_ENTRIES = 1000
STORABLE = frozenset({COMPLETE, FAILED, CORRUPT, STALE})
FIELDS = ENTRY_FIELDS
_RELPATH = FIELDS.index("relpath")
_OP = FIELDS.index("op")
_TARGET = FIELDS.index("target")
_MODIFIED = FIELDS.index("modified")
_PATH = FIELDS.index("path")
_NFIELDS = len(FIELDS)
# Fields whose values entries share (a layout, an op, an arch, a status): stored as one string each, which
# pickle then writes once and the next command makes once (a 20,000-kernel index loads 20-25% faster).
_SHARED = frozenset(FIELDS.index(f) for f in ("layout", "kind", "target", "space", "op", "status", "reason"))
_MAX_BYTES = 1 << 31
# The modules whose code decides what a record holds; a change to any of them drops the index.
_JUDGES = ("kcache_cli.catalog.scan", "kcache_cli.catalog.scan_context", "kcache_cli.catalog.index",
           "kcache_cli.model.records", "kcache_cli.model.checks", "kcache_cli.model.terms", "kcache_cli.layouts.shapes",
           "kcache_cli.fs.state", "kcache_cli.fs.locking", "kcache_cli.fs.read", "kcache_cli.formats.taskfile",
           "kcache_cli.layouts.base", "kcache_cli.layouts._common", "kcache_cli.fs.entrydir",
           "kcache_cli.formats.binary", "kcache_cli.formats.gpu", "kcache_cli.util.units")
_PLAIN = (str, int, float, bool, bytes, type(None))

# (file names, digest, (function name, job), Entry field values, the rest of the function's answer or None)
Record = tuple


_DIR_KEY = struct.Struct("<Qqq").pack  # the directory's inode, mtime, ctime
_FILE_KEY = struct.Struct("<Qqqq").pack  # a file's inode, size, mtime, ctime


def _key(top: os.stat_result, sts: list[os.stat_result]) -> tuple[bytes, float]:
    """(the digest of the directory's stat `top` and its files' `sts`, the files' newest atime as they
    are: readmarks.newest_atime without its notes). One pass over the stats, each packed as it is read:
    with the atimes, two thirds of an unchanged entry's Python time went to walking them twice."""
    newest = 0.0
    try:
        h = blake2b(_DIR_KEY(top.st_ino, top.st_mtime_ns, top.st_ctime_ns), digest_size=16)
        update = h.update
        for st in sts:
            update(_FILE_KEY(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns))
            if st.st_atime > newest and S_ISREG(st.st_mode):
                newest = st.st_atime
    except struct.error:  # an inode or a time beyond 64 bits
        ints = [(st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns) for st in sts]
        h = blake2b(repr((top.st_ino, top.st_mtime_ns, top.st_ctime_ns, ints)).encode(), digest_size=16)
        newest = max([st.st_atime for st in sts if S_ISREG(st.st_mode)], default=0.0)
    return h.digest(), newest


def _fresh(where: str, names: tuple[str, ...], digest: bytes, dir_fd: int | None = None) -> float | None:
    """The newest atime of its files when the entry at `where` (relative to `dir_fd`, the root held open,
    or absolute) still has exactly the files and stats its record was keyed with (atime is not in the key:
    a read changes nothing the record holds), else None. Names outside the entry (`../`: the fx graphs an
    aotautograd entry names) are in its key, not its use: the real scan's last use is its own files'."""
    lstat = os.lstat
    prefix = where + "/"
    try:
        top = lstat(where, dir_fd=dir_fd)
        sts = [lstat(prefix + name, dir_fd=dir_fd) for name in names]
    except (OSError, ValueError, TypeError):
        return None
    key, newest = _key(top, sts)
    if key != digest:
        return None
    if names and names[-1].startswith("../"):  # graphs an aotautograd entry names: after its files (_seen)
        if not _dirs_on_the_way(prefix, names, dir_fd):
            return None
        sts = [st for name, st in zip(names, sts) if not name.startswith("../")]
    elif not readmarks.MARKS and not fsread.MOVED:  # no read of kcache's noted: the atimes as they are
        return newest
    return readmarks.newest_atime(sts)


def _dirs_on_the_way(prefix: str, names: tuple[str, ...], dir_fd: int | None) -> bool:
    """Whether the directories that the key's names outside the entry (`../`) lead through, and that are
    no name of the key themselves (an aotautograd entry's `../../fxgraph/<xx>/`), are still directories:
    lstat follows a link on the way, so one swapped for a link to the same directory keeps every stat the
    key holds, where the scan, which follows none, finds the graph missing."""
    between: set[str] = set()
    for name in names:
        if name.startswith("../"):
            parts = name.split("/")
            up = next((i for i, part in enumerate(parts) if part != ".."), len(parts))
            between.update("/".join(parts[:i]) for i in range(up + 1, len(parts)))
    try:
        return all(S_ISDIR(os.lstat(prefix + rel, dir_fd=dir_fd).st_mode) for rel in between.difference(names))
    except (OSError, ValueError, TypeError):
        return False


_INTERNED: dict[tuple[str, ...], tuple[str, ...]] = {}


def _plain(value: Any) -> bool:
    """Plain data, or tuples of it (a Triton job: its path and the ops wanted)."""
    return type(value) in _PLAIN or (type(value) is tuple and all(_plain(v) for v in value))


def _record(out: Any, asked: tuple, seen, warned: list, racy_ns: int) -> Record | None:
    """The record of a freshly judged entry (`out`: an Entry, or a tuple whose first item is one), or
    None when it must not be stored."""
    if isinstance(out, Entry):
        entry, rest = out, None
    elif type(out) is tuple and out:
        entry, rest = out[0], tuple(out[1:])
    else:
        return None
    path = asked[1][0]
    if (warned or seen is None or not isinstance(entry, Entry) or entry.status not in STORABLE
            or entry.path != path or not _plain(asked[1]) or (rest is not None and not _plain(rest))):
        return None
    dir_stat, stats = seen
    newest = dir_stat.st_ctime_ns
    for _, st in stats:
        if S_ISLNK(st.st_mode):  # the judgement may read through it: its target is not in the key
            return None
        if st.st_ctime_ns > newest:
            newest = st.st_ctime_ns
    if newest >= racy_ns:
        return None
    names = tuple([n for n, _ in stats])
    names = _INTERNED.setdefault(names, names)  # entries share their file names: pickled once
    values = tuple([sys.intern(v) if i in _SHARED and type(v) is str else v
                    for i, v in enumerate(ENTRY_VALUES(entry.__dict__))])
    return names, _key(dir_stat, [st for _, st in stats])[0], asked, values, rest


def _func_name(func: Callable) -> str:
    return f"{getattr(func, '__module__', '?')}.{getattr(func, '__qualname__', '?')}"


def _shaped(rec: Any) -> bool:
    """Whether `rec` has a record's shape (_record's): five items, the entry's field values fourth. The
    index file is plain data that passed its CRC, not proof that it is ours."""
    return type(rec) is tuple and len(rec) == 5 and type(rec[3]) is tuple and len(rec[3]) == _NFIELDS


def _servable(rec: Any, asked: tuple, anchor: fsread.Anchor | None = None) -> float | None:
    """When `rec` is a well-formed record of the same function and job (its entry's path the job's, as
    _record stores it) whose files are unchanged: the newest atime of those files; else None. Below the
    root held open (`anchor`), its files are lstat'ed from it: the root's path is not walked again for
    each (7% of an unchanged entry's time)."""
    path = asked[1][0]
    if _shaped(rec) and rec[2] == asked and rec[3][_PATH] == path and (rec[4] is None or type(rec[4]) is tuple):
        if anchor is not None and anchor.fd >= 0 and anchor.holds(path):
            return _fresh(anchor.rel(path), rec[0], rec[1], anchor.fd)  # _fresh fails on odd names
        return _fresh(path, rec[0], rec[1])
    return None


def _last_use(ctx: ScanContext, rec: Record, accessed: float) -> float:
    """A served record's answer from a worker: its entry's last use now (its files' newest atime being
    `accessed`); the parent makes the entry from its own copy of the record."""
    values = rec[3]
    return ctx.last_used_of(values[_RELPATH], values[_MODIFIED], accessed, values[_PATH])


class _Wrapped:
    """`func(ctx, job)` behind the index: the entry's last use (a float: kcache's stamp, its newest mtime
    or, where reads are recorded, its files' newest atime now) when the stored record of job's entry
    serves, else (the answer or None, Record or None) from the real scan (the answer only when there is
    no record to build it from: records travel from worker processes more cheaply than Entries inside a
    tuple), or, in a worker of a complete scan, the Entry alone, its record kept with the worker's others
    (begin_part). A class, not a closure: parallel.map_parts may have to pickle it."""

    def __init__(self, func: Callable, stored: dict, racy_ns: int, complete: bool = True,
                 unfiltered: Callable | None = None) -> None:
        self.func, self.name, self.stored, self.racy_ns = func, _func_name(func), stored, racy_ns
        self.complete = complete  # the scan visits every entry (IndexedContext.save)
        self.unfiltered = unfiltered  # a job without its filter, and the filter (map_entries)
        self.kept: dict | None = None  # in a worker of a complete scan: the records it made (begin_part)

    def begin_part(self) -> None:
        """In a worker process, before its jobs: a complete scan's records are kept here, and go back to
        the parent as one pickle (end_part) that it writes as it is, not one by one through the results
        (the parent unpickled each, and pickled them all again to write them: 80-95 ms of one core after a
        first listing of 20,000 Triton kernels)."""
        if self.complete:
            self.kept = {}

    def end_part(self) -> bytes | None:
        """In a worker process, after its jobs: the pickle of the records it kept, or None."""
        kept, self.kept = self.kept, None
        return pickle.dumps(kept, protocol=pickle.HIGHEST_PROTOCOL) if kept else None

    def __call__(self, ctx: ScanContext, job: tuple) -> tuple | float | Entry:
        asked = (self.name, tuple(job))
        rec: Any = self.stored.get(job[0])
        accessed = _servable(rec, asked, ctx.anchor)
        if accessed is not None:  # in the worker, not the parent: the parent builds the answers alone
            return _last_use(ctx, rec, accessed)
        if not self.complete and type(rec) is tuple and len(rec) == 5 and rec[2] != asked:
            answer = self._unfiltered(ctx, job, rec)
            if answer is not None:
                return answer
            return self.func(ctx, job), None  # a filtered scan keeps another job's record: none is made
        return self.judge(ctx, job, asked)

    def _unfiltered(self, ctx: ScanContext, job: tuple, rec: tuple) -> tuple | float | None:
        """For a job that carries an op or target filter (`self.unfiltered(job)`: the job without it, and
        the filter, a ScanFilter of ops and targets), the answer of the unfiltered scan's record `rec` where
        it serves: its entry when its op and target are wanted (its last use), None (the entry is not one)
        when not. None when it does not serve."""
        if self.unfiltered is None:
            return None
        whole, wanted = self.unfiltered(job)
        accessed = _servable(rec, (self.name, tuple(whole)), ctx.anchor)
        if accessed is None:
            return None
        if not (wanted.wants_op(rec[3][_OP]) and wanted.wants_target(rec[3][_TARGET])):
            return None, None
        return _last_use(ctx, rec, accessed)

    def judge(self, ctx: ScanContext, job: tuple, asked: tuple) -> tuple | Entry:
        path = job[0]
        warned: list[str] = []
        warn = ctx.warn

        def collect(msg: str) -> None:
            warned.append(msg)
            warn(msg)

        seen: dict = {}
        ctx.warn, ctx.recording = collect, seen
        try:
            out = self.func(ctx, job)
        finally:
            ctx.warn, ctx.recording = warn, None
        new = _record(out, asked, seen.get(path), warned, self.racy_ns)
        if new is not None and self.kept is not None and type(out) is Entry:
            self.kept[new[2][1][0]] = new
            return out  # its record goes back with the worker's others (end_part)
        return (None, new) if new is not None else (out, None)


class _NoGlobals(pickle.Unpickler):
    """Loads only plain data (tuples, dicts, str, bytes, numbers): any class or function is refused."""

    def find_class(self, module: str, name: str):
        raise pickle.UnpicklingError(f"global {module}.{name} refused")


def _code_file(name: str) -> str | None:
    """The source file of the module `name`, without importing it when it is not loaded yet (the judging
    modules of layouts this cache does not hold: importing them all cost 15-25 ms)."""
    mod = sys.modules.get(name)
    if mod is not None:
        return getattr(mod, "__file__", None)
    spec = find_spec(name)
    return spec.origin if spec is not None else None


def _context(root: str) -> tuple:
    code: list[tuple] = []
    for name in _JUDGES + tuple(f"kcache_cli.layouts.{n}" for n in NAMES):
        try:
            st = os.stat(_code_file(name) or "")
            code.append((name, st.st_size, st.st_mtime_ns, st.st_ino))
        except (ImportError, ValueError, OSError):
            code.append((name, None))
    st = fsread.stat_path(root)
    return (FORMAT, kcache_cli.__version__, sys.implementation.cache_tag, os.geteuid(), tuple(sorted(os.getgroups())),
            root, st.st_dev, st.st_ino, FIELDS, tuple(code))


def load(root: str, context: tuple, kind: str = "scan") -> dict:
    """path -> Record from the index of `root` (or what `kind`'s file holds), or {} when there is none
    or it cannot be trusted."""
    data = read_index_file(root, kind, _MAX_BYTES)
    parts = unframed(data) if data is not None else None
    if parts is None:
        return {}
    try:
        objs = _unpickled(parts)
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, AttributeError,
            MemoryError, RecursionError, OverflowError, ImportError):  # passed its CRC, yet not ours: no index
        return {}
    obj = objs[0]
    if (type(obj) is not dict or obj.get("context") != context or type(obj.get("records")) is not dict
            or any(type(more) is not dict for more in objs[1:])):
        return {}
    records = obj["records"]
    for more in objs[1:]:
        records.update(more)
    return records


def framed(parts: list[bytes]) -> bytes:
    """An index file's bytes: MAGIC, how many parts, each part's length and CRC-32, the parts."""
    return b"".join([MAGIC, _PARTS.pack(len(parts)), *(_HEADER.pack(len(p), zlib.crc32(p)) for p in parts),
                     *parts])


def unframed(data: bytes) -> list[memoryview] | None:
    """The parts of an index file's bytes (framed), or None when they are not that: another format, a
    truncated or garbled file (a length or CRC that does not hold)."""
    at = len(MAGIC) + _PARTS.size
    if not data.startswith(MAGIC) or len(data) < at:
        return None
    (n,) = _PARTS.unpack_from(data, len(MAGIC))
    if not 1 <= n <= _MAX_PARTS or len(data) < at + n * _HEADER.size:
        return None
    heads = [_HEADER.unpack_from(data, at + i * _HEADER.size) for i in range(n)]
    at += n * _HEADER.size
    view, parts = memoryview(data), []
    for length, crc in heads:
        part = view[at:at + length]
        if len(part) != length or zlib.crc32(part) != crc:
            return None
        parts.append(part)
        at += length
    return parts if at == len(data) else None


def recorded(root: str, field: str) -> dict[str, Any]:
    """relpath -> `field` of each entry the index of `root` holds, as the scan that stored it judged the
    entry: not proven unchanged since (nothing is stat'ed), so for offering names (completion), never for
    selecting entries. {} when there is no index to trust."""
    try:
        context = _context(root)
    except OSError:
        return {}
    i = FIELDS.index(field)
    try:  # records as _record makes them; anything else (the file passed its checks, yet is not ours): none
        return {v[_RELPATH]: v[i] for v in (rec[3] for rec in load(root, context).values()) if len(v) == _NFIELDS}
    except (TypeError, IndexError, KeyError):
        return {}


def _unpickled(parts: list[memoryview]) -> list[Any]:
    """The index's plain data, each part unpickled with the cyclic collector held off, and a big index moved
    out of its reach (gc.freeze) before it is let back on: the first object made after that would set off a
    collection of every record. 10^5 records are tuples of strings and numbers, acyclic and kept until the
    process exits: collections while they were made walked them again and again (80 ms of a 100,000-entry
    listing), one after walked them once more (17-25 ms of a 20,000-kernel one; 80 ms of 100,000), and a
    forked worker copies every page a collection touches. TypeError when the first part's records have no
    length (not an index of ours: load's no index)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        objs = [_NoGlobals(io.BytesIO(part)).load() for part in parts]
        first = objs[0].get("records") if type(objs[0]) is dict else None
        if len(first or ()) + sum(len(more) for more in objs[1:] if type(more) is dict) >= MIN_ENTRIES:
            gc.freeze()
    finally:
        if enabled:
            gc.enable()
    return objs


@dataclass
class IndexedContext(ScanContext):
    """A ScanContext whose map_entries answers from the index where it provably can (see the module doc).
    `complete`: the scan visits every entry (no filter), see save."""

    complete: bool = field(default=True, repr=False, compare=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        root = str(self.root)
        self._stored: dict = {}
        self._new: dict = {}
        self._kept: list[bytes] = []  # records the workers kept, pickled (kept_by_workers)
        self._changed = False
        self._writer: tuple[int, int, str, int] | None = None  # index dir fd, temp fd, temp name, racy limit
        self._started = time.monotonic_ns()  # before the layouts read anything (see _start_write)
        try:
            self._context = _context(root)
        except OSError:
            return
        self._stored = load(root, self._context)

    def map_entries(self, func, jobs: list, unfiltered: Callable | None = None,
                    meanwhile: Callable[[], None] | None = None) -> Iterator[Entry]:
        stored, new = self._stored, self._new
        if self._writer is None and hasattr(self, "_context") and (len(jobs) >= MIN_ENTRIES or stored):
            self._writer = _start_write(str(self.root), self._started)  # before any entry is stat'ed
        racy_ns = self._writer[3] if self._writer else -1  # no writer: nothing will be stored anyway
        wrapped = _Wrapped(func, stored, racy_ns, self.complete, unfiltered)
        made: list[Entry | None] = []

        def prepare() -> None:
            _made(stored, jobs, made)
            if meanwhile is not None:
                meanwhile()

        results: Iterator[Any] = super().map_entries(wrapped, jobs, meanwhile=prepare)
        for i, (job, out) in enumerate(zip(jobs, results)):
            path = job[0]
            if type(out) is float:  # served: the entry's last use now
                rec = new[path] = stored[path]
                yield _answer_of(rec, out, made[i] if made else None)
                continue
            if type(out) is Entry:  # judged in a worker, which keeps its record (_Wrapped.end_part)
                self._changed = True
                yield out
                continue
            answer, rec = out
            if rec is None:
                if path in stored:
                    self._changed = True  # its record no longer holds
                yield answer
                continue
            self._changed = True
            new[rec[2][1][0]] = rec  # keyed by the record's own path object: pickled once, not twice (-24%)
            yield _answer_of(rec)

    def kept_by_workers(self, kept: list) -> None:
        """The records each worker kept, pickled (_Wrapped.end_part): written as they are (save)."""
        self._kept += kept

    def save(self) -> None:
        """Write the index if this scan learnt anything; a complete one (unfiltered) also drops the
        records of entries that are gone. A filtered scan (`ls --op`, `clear --op`: its filter is in each
        job) adds records, and refreshes those of its own job, but never replaces one of another job: the
        unfiltered scan's records (ls, stats, prune) would each be judged again by the next of those, and
        rewritten (a 20,000-kernel index swapped between the two at every alternation). Never raises."""
        if self._writer is None:
            return
        dfd, fd, tmp, _ = self._writer
        self._writer = None
        stored = self._stored
        if self.complete:
            # Unchanged, each stored record visited was served (else it changed): one is gone or was not
            # visited exactly when fewer were served than stored (a set of 10^5 visited paths cost 15 ms).
            learnt = self._changed or bool(self._kept) or len(self._new) < len(stored)
            records = self._new
        else:
            mine = {p: r for p, r in self._new.items() if stored.get(p, r)[2] == r[2] and stored.get(p) is not r}
            learnt, records = bool(mine), {**stored, **mine}
        _finish_write(dfd, fd, tmp, {"context": self._context, "records": records} if learnt else None, self._kept)


def _made(stored: dict, jobs: list, made: list) -> None:
    """Into `made`, for each job, the Entry its stored record holds (None: no well-formed record), made
    while the workers read: an entry they serve is then only given its last use (_answer_of). 20,000 of
    them cost the scan 30 ms after the workers' reads; beside them, half that."""
    get = stored.get
    for job in jobs:
        rec: Any = get(job[0])
        made.append(entry_from(rec[3]) if _shaped(rec) else None)


def _answer_of(rec: Record, last_used: float | None = None, made: Entry | None = None) -> Any:
    """What the layout's function answered when the record was made; for a record served, with the
    entry's `last_used` now. `made`: the Entry of `rec` made already (_made)."""
    entry = made or entry_from(rec[3])  # the fields as stored (a frozen dataclass's __init__ costs 4x)
    if last_used is not None:
        entry.__dict__["last_used"] = last_used
    return entry if rec[4] is None else (entry, *rec[4])


def _start_write(root: str, started: int) -> tuple[int, int, str, int] | None:
    """Create the temp file the index will be written to (state.start_index_write): its ctime is the file
    system's "now", less the time since the scan `started` (time.monotonic_ns), from which entries are
    judged too recent to store. None when the cache is not writable."""
    made = start_index_write(root)
    if made is None:
        return None
    dfd, fd, tmp, now = made
    return dfd, fd, tmp, now - (time.monotonic_ns() - started) - int(RACY_SECONDS * 1e9)


def _finish_write(dfd: int, fd: int, tmp: str, obj: dict | None, more: Sequence[bytes] = (),
                  kind: str = "scan") -> None:
    """Write `obj` (None: nothing), and the records pickled in `more`, through the temp file (`fd`, named
    `tmp`) made by _start_write, then close it and the index directory's `dfd`; the temp file never stays.
    Never raises."""
    data = None
    if obj is not None:
        try:
            data = framed([pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), *more])
        except (pickle.PicklingError, ValueError, RecursionError, TypeError):
            data = None
    finish_index_write(dfd, fd, tmp, data, kind)
