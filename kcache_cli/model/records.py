"""The data kcache's core hands out: frozen dataclasses of raw values (bytes, epoch seconds); the small
values that need nothing more (Judgement, TreeUsage, Details, FileInfo, TensorInfo, LogFile) are NamedTuples,
which cost a tenth as much to define (each frozen dataclass costs every command that imports this 0.3-0.8 ms)
and to make.

One entry record: an entry is named everywhere by its `EntryKey` (layout, kind, target, space, op,
hash, relpath: the fields of `ls --json` that say which entry it is), and each feature's record holds
that key plus its own payload instead of re-declaring the fields: the scan's `Entry` (path, size,
files, status, times; its `key` is a property, as layouts build it flat), the archive manifest's
`EntryRecord` (files, links, dirs, locks, facts), export's `ExportedEntry`, import's `ImportedEntry`,
push and pull's `MovedEntry` (action, done, reason), the remote index's `RemoteEntry` (pushed, last
pulled). `Keyed` reads the key's fields through (`e.op`), so a filter, a table or a sort takes any of
them. Records that wrap a scanned entry (verify's `EntryCheck`, `Details`, delete's `Removal` and
`Skip`) hold the `Entry` itself. Statuses, actions and removal kinds are the `Literal` types of
kcache_cli/model/terms.py."""

from __future__ import annotations

import heapq
import os
import re
import stat
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, fields
from fnmatch import fnmatchcase
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple, Protocol

from kcache_cli.fs import readmarks
from kcache_cli.fs.read import MAX_TREE_DEPTH, open_path, sorted_entries, stat_path
from kcache_cli.model.terms import (  # noqa: F401
    BUILDING,
    COMPLETE,
    CORRUPT,
    FAILED,
    KINDS,
    LAYOUT_NAMES,
    MOVED,
    PARTIAL,
    STALE,
    STATUSES,
    UNREADABLE,
    Status,
)
from kcache_cli.util.units import is_digits

UNREADABLE_REASON = "unreadable directory (permission denied?)"


def unmeasured(e: "Entry") -> bool:
    """A directory the scan could not list, an entry's own or one standing for the entries in it: its size
    (0 in the scan) is not known."""
    return e.status == UNREADABLE and (not e.hash or e.reason == UNREADABLE_REASON)

# Keys of `ls --json`, in order (kcache_cli/schemas/ls.json); the attribute `files` is `file_count` there.
JSON_KEYS = ("layout", "kind", "target", "space", "op", "hash", "path", "size", "apparent_size", "file_count",
             "status", "reason", "modified", "last_used")

Warn = Callable[[str], None]


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    second = int(ts)
    text = _ISO_SEEN.get(second)
    if text is None:  # entries written together share their second: format each second once
        text = _ISO_SEEN[second] = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(second))
    return text


_ISO_SEEN: dict[int, str] = {}


class EntryKey(NamedTuple):
    """What names an entry wherever it appears (a scan, an archive's manifest, a remote): the fields of
    `ls --json` that say which entry it is, as opposed to its size, status or times. (A NamedTuple: an
    import makes one per entry.)"""

    layout: str
    kind: str  # "" for a remote entry whose index does not say (its JSON writes null)
    target: str | None
    space: str | None
    op: str | None
    hash: str
    relpath: str  # relative to the cache root, '/'-separated

    def to_json(self) -> dict:
        return self._asdict()


class Keyed:
    """A record that holds an entry's `key` and reads its fields through (`e.op`, `e.relpath`), for the
    filter (Selectable), tables and sorts."""

    __slots__ = ()
    key: EntryKey

    @property
    def layout(self) -> str:
        return self.key.layout

    @property
    def kind(self) -> str:
        return self.key.kind

    @property
    def target(self) -> str | None:
        return self.key.target

    @property
    def space(self) -> str | None:
        return self.key.space

    @property
    def op(self) -> str | None:
        return self.key.op

    @property
    def hash(self) -> str:
        return self.key.hash

    @property
    def relpath(self) -> str:
        return self.key.relpath


@dataclass(frozen=True)
class Entry:
    """One cache entry: an operator, graph, program, script, kernel or binary directory."""

    layout: str
    kind: str
    target: str | None
    space: str | None
    op: str | None
    hash: str
    path: str  # absolute
    relpath: str  # relative to the cache root, '/'-separated
    size: int  # bytes on disk (st_blocks * 512, as du counts them, the entry's directories included)
    files: int
    status: Status
    reason: str | None
    modified: float
    last_used: float
    apparent_size: int  # the files' own bytes (st_size; du --apparent-size -b)
    # The entry's identity as the scan saw it (its directory's, or a link's, own device and inode; 0:
    # unknown): a removal whose target is another inode by then is skipped (delete._Executor).
    dev: int = field(default=0, compare=False, repr=False)
    ino: int = field(default=0, compare=False, repr=False)
    # The directories directly in the entry's own directory as its scan listed them (-1: not counted):
    # prune looks inside an entry for a layout's leftovers (Triton's killed writes, tmp.pid_*/) only where
    # there is one, not in each of 10^5 kernel directories again.
    subdirs: int = field(default=-1, compare=False, repr=False)

    @property
    def key(self) -> EntryKey:
        return EntryKey(self.layout, self.kind, self.target, self.space, self.op, self.hash, self.relpath)

    def to_json(self) -> dict:
        """The entry as `ls --json` writes it, its keys JSON_KEYS. A dict display (one opcode builds it), not
        dict(zip(...)): `ls --json` makes 10^5 of these, in 60% of the time, and orjson encodes the compact
        dict faster too (20,000 entries: 33 -> 21 ms)."""
        d = self.__dict__
        return {"layout": d["layout"], "kind": d["kind"], "target": d["target"], "space": d["space"],
                "op": d["op"], "hash": d["hash"], "path": d["path"], "size": d["size"],
                "apparent_size": d["apparent_size"], "file_count": d["files"], "status": d["status"],
                "reason": d["reason"], "modified": iso(d["modified"]), "last_used": iso(d["last_used"])}


ENTRY_FIELDS = tuple(f.name for f in fields(Entry))
_ENTRY_KEYS = frozenset(ENTRY_FIELDS)
# An Entry's field values, in ENTRY_FIELDS order, from its __dict__ (one C call): what travels from a
# worker and what the index stores, made an Entry again by entry_from.
ENTRY_VALUES = itemgetter(*ENTRY_FIELDS)


def entry_from(values: tuple) -> Entry:
    """The Entry whose ENTRY_VALUES are `values`, built as entry_of builds one."""
    entry = object.__new__(Entry)
    entry.__dict__.update(zip(ENTRY_FIELDS, values))
    return entry


def entry_of(attrs: dict[str, Any]) -> Entry:
    """Entry(**attrs), without the frozen dataclass's __init__ (which sets one field at a time through
    object.__setattr__: twice the cost, and a scan makes one per entry) when `attrs` holds exactly the
    fields; anything else goes to __init__, which says what is wrong."""
    if attrs.keys() != _ENTRY_KEYS:
        return Entry(**attrs)
    entry = object.__new__(Entry)
    entry.__dict__.update(attrs)
    return entry


def entry_with(entry: Entry, **changes: Any) -> Entry:
    """dataclasses.replace(entry, **changes) at entry_of's cost (a fifth of replace's)."""
    return entry_of({**entry.__dict__, **changes})


_GLOB = frozenset("*?[")


def is_glob(pattern: str) -> bool:
    return not _GLOB.isdisjoint(pattern)


def _name_matches(value: str | None, wanted: tuple[str, ...]) -> bool:
    if value is None:
        return False
    return any(value == w or (is_glob(w) and fnmatchcase(value, w)) for w in wanted)


def space_matches(space: str | None, wanted: str) -> bool:
    """`cuda_space_2` is asked for as `cuda_space_2`, `2` (any target's level 2) or a glob (`cuda_*`)."""
    if space is None:
        return False
    if is_digits(wanted):
        return space.endswith(f"_space_{wanted}") and space[:-len(f"_space_{wanted}")].isalnum()
    return space == wanted or (is_glob(wanted) and fnmatchcase(space, wanted))


class Judgement(NamedTuple):
    """A layout's verdict on one entry's files: the same function gives it to ls (cheap) and to
    verify, inspect, prune --broken and import (deep), so they cannot disagree on the same files."""

    status: Status
    reason: str | None = None
    problems: tuple[str, ...] = ()  # every problem found; the first is `reason`

    @staticmethod
    def of(status: Status, reason: str | None = None) -> Judgement:
        return Judgement(status, reason, (reason,) if reason else ())


class Selectable(Protocol):
    """What a filter reads of an entry, local (Entry) or on a remote (remote.manage.RemoteEntry): one
    selection path for every command."""

    @property
    def layout(self) -> str: ...
    @property
    def kind(self) -> str | None: ...
    @property
    def target(self) -> str | None: ...
    @property
    def space(self) -> str | None: ...
    @property
    def op(self) -> str | None: ...
    @property
    def hash(self) -> str: ...
    @property
    def relpath(self) -> str: ...
    @property
    def status(self) -> Status: ...
    @property
    def size(self) -> int: ...
    @property
    def last_used(self) -> float: ...


@dataclass(frozen=True)
class ScanFilter:
    """What to keep. Empty tuples mean "all". Layouts use ops/spaces/targets to skip directories, so the
    CLI hands them concrete names (names.expand_filter turns globs and `--space 2` into the names
    present); matches() understands globs and the bare level too."""

    ops: tuple[str, ...] = ()  # names or globs (`mat*`)
    spaces: tuple[str, ...] = ()  # names, a bare level (`2`) or globs
    targets: tuple[str, ...] = ()
    layouts: tuple[str, ...] = ()
    statuses: tuple[Status, ...] = ()
    kinds: tuple[str, ...] = ()
    hash_prefixes: tuple[str, ...] = ()
    paths: tuple[str, ...] = ()  # entries by their path relative to the root; OR-ed with hash_prefixes
    min_size: int | None = None  # bytes, inclusive (`--min-size 1M`)
    max_size: int | None = None  # bytes, inclusive
    older_than: float | None = None  # seconds since last use (`--older-than 30d`)
    newer_than: float | None = None  # seconds since last use (`--newer-than 1d`)
    now: float = 0.0  # when the ages are measured from (set with older_than/newer_than)

    def wants_op(self, op: str | None) -> bool:
        return not self.ops or _name_matches(op, self.ops)

    def wants_space(self, space: str | None) -> bool:
        return not self.spaces or any(space_matches(space, s) for s in self.spaces)

    def wants_target(self, target: str | None) -> bool:
        return not self.targets or target in self.targets

    def name_prefixes(self) -> tuple[str, ...]:
        """What an entry's directory name must start with (hash prefixes and the last part of each path),
        for layouts that skip directories by name; () means any."""
        if not (self.hash_prefixes or self.paths):
            return ()
        return self.hash_prefixes + tuple(p.rsplit("/", 1)[-1] for p in self.paths)

    def wants_ref(self, e: Selectable) -> bool:
        if not (self.hash_prefixes or self.paths):
            return True
        return any(e.hash.startswith(p) for p in self.hash_prefixes) or e.relpath in self.paths

    def takes_all(self) -> bool:
        """Whether every entry matches (no selector set): a scan of a big cache then skips matches()."""
        return self == _ALL

    def matches(self, e: Selectable) -> bool:
        return (
            self.wants_op(e.op)
            and self.wants_space(e.space)
            and self.wants_target(e.target)
            and (not self.layouts or e.layout in self.layouts)
            and (not self.statuses or e.status in self.statuses)
            and (not self.kinds or e.kind in self.kinds)
            and self.wants_ref(e)
            and self.wants_size_age(e)
        )

    def wants_size_age(self, e: Selectable) -> bool:
        """--min-size/--max-size on the entry's bytes, --older-than/--newer-than on its last use."""
        if self.min_size is not None and e.size < self.min_size:
            return False
        if self.max_size is not None and e.size > self.max_size:
            return False
        age = self.now - e.last_used
        if self.older_than is not None and age < self.older_than:
            return False
        return self.newer_than is None or age <= self.newer_than


_ALL = ScanFilter()


@dataclass(frozen=True)
class ScanResult:
    """What a scan of one root found: the layouts there, their entries, its warnings."""

    root: str
    exists: bool
    layouts: tuple[str, ...]
    entries: tuple[Entry, ...]
    warnings: tuple[str, ...] = field(default=())
    unlisted: bool = False  # the root itself could not be listed: its entries are not known (not absent)

    @property
    def size(self) -> int:
        return sum(e.size for e in self.entries)

    def to_json(self, top: int = 10) -> dict:
        """`stats --json`: totals, breakdowns by layout, space, op, status and kind (entries and bytes
        each), the `top` biggest entries (as `ls --json` rows) and the scan's warnings."""
        columns = list(zip(*map(_BREAKDOWN_FIELDS, self.entries))) or [()] * 6
        layouts_, spaces, ops, statuses, kinds, sizes = columns
        groups = {"by_layout": _breakdown(layouts_, sizes), "by_space": _breakdown(spaces, sizes, True),
                  "by_op": _breakdown(ops, sizes, True), "by_status": _breakdown(statuses, sizes),
                  "by_kind": _breakdown(kinds, sizes)}
        # an entry without a space (op) is counted under no_space (no_op): a JSON key is never null
        no_space, no_op = groups["by_space"].pop(None, None), groups["by_op"].pop(None, None)
        biggest = heapq.nlargest(top, self.entries, key=attrgetter("size", "relpath"))
        layouts = list(self.layouts)
        return {"root": self.root, "exists": self.exists,
                "layout": layouts[0] if len(layouts) == 1 else ("mixed" if layouts else None),
                "layouts": layouts, "entry_count": len(self.entries), "size": sum(sizes),
                "apparent_size": sum(e.apparent_size for e in self.entries),
                **{k: dict(sorted(v.items())) for k, v in groups.items()},
                "no_space": no_space, "no_op": no_op,
                "biggest": [e.to_json() for e in biggest], "warnings": list(self.warnings)}


_BREAKDOWN_FIELDS = attrgetter("layout", "space", "op", "status", "kind", "size")


def _breakdown(values: tuple, sizes: tuple, empty_is_none: bool = False) -> dict:
    """{value: {"entry_count", "size"}} of the entries whose field took each value; with `empty_is_none`,
    an empty value counts as None (no space, no op)."""
    if empty_is_none and "" in values:
        values = tuple(v or None for v in values)
    counts = Counter(values)
    totals = dict.fromkeys(counts, 0)
    for value, size in zip(values, sizes):
        totals[value] += size
    return {v: {"entry_count": n, "size": totals[v]} for v, n in counts.items()}


class TreeUsage(NamedTuple):
    """A directory tree measured as du measures it: size on disk, files, newest times."""

    size: int  # bytes on disk of the tree, its directories included (st_blocks * 512: du -sB1)
    files: int
    mtime: float  # newest mtime of the directory and anything in it
    atime: float = 0.0  # newest atime of its regular files (a listing sets a directory's, a readlink a link's)
    apparent: int = 0  # the st_size of its regular files and links (du -sb without directories)
    dev: int = 0  # the identity of the directory itself (0: unknown), an entry's identity in the scan
    ino: int = 0


def disk_bytes(st: os.stat_result) -> int:
    """What a file or directory takes on disk: its allocated blocks (st_blocks is in 512-byte units). A
    file with several names (hard links) counts its share under each (`file_bytes`)."""
    if st.st_nlink > 1 and not stat.S_ISDIR(st.st_mode):
        return st.st_blocks * 512 // st.st_nlink
    return st.st_blocks * 512


def file_bytes(st: os.stat_result) -> int:
    """disk_bytes of what is not a directory: a file hard-linked N times counts 1/N of its blocks under each
    name, so that a tree holding all its names sums to what du counts (each inode once), and a budget
    prune never counts the same blocks once per entry (removing one name frees nothing)."""
    return st.st_blocks * 512 // (st.st_nlink or 1)


_LIST_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def measure_tree(path: str, warn: Warn, rel: str = "") -> TreeUsage:
    """Size, file count, newest mtime and last use (its files' newest atime, as it was before kcache's own
    reads: readmarks.atime) of a directory tree; never follows symlinks.

    An unreadable directory is a warning and counts as empty, not an exception. Iterative, and at
    most MAX_TREE_DEPTH directories deep (a deeper tree is a warning; what lies below is not counted)."""
    try:
        top = stat_path(path, follow=False)
    except OSError as exc:
        warn(f"cannot stat {path}: {exc.strerror}")
        return TreeUsage(0, 0, 0.0)
    try:  # below a held root, from its fd; every directory below from this one's (as the path would)
        top_fd = open_path(path, _LIST_FLAGS)
    except OSError as exc:
        warn(f"cannot read {path}: {exc.strerror}")
        return usage_of(top, [])
    return _measure_open(top, top_fd, path, warn)


def measure_at(dir_fd: int, name: str, warn: Warn) -> TreeUsage:
    """measure_tree of `name` in the directory `dir_fd`, opened from it following no link (a link is its
    own size). `name` is what warnings call it."""
    try:
        top = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        if not stat.S_ISDIR(top.st_mode):
            return usage_of(top, [])
        top_fd = os.open(name, _LIST_FLAGS | os.O_NOFOLLOW, dir_fd=dir_fd)  # swapped for a link since: refused
    except OSError as exc:
        warn(f"cannot read {name}: {exc.strerror}")
        return TreeUsage(0, 0, 0.0)
    return _measure_open(top, top_fd, name, warn)


def _measure_open(top: os.stat_result, top_fd: int, path: str, warn: Warn) -> TreeUsage:
    """measure_tree of the directory held open as `top_fd` (closed here), whose lstat is `top`."""
    sts: list[os.stat_result] = []  # every name's beneath it
    stack = [("", 0)]
    too_deep = False
    try:
        while stack:
            sub, depth = stack.pop()
            try:
                fd = os.open(sub, _LIST_FLAGS, dir_fd=top_fd) if sub else top_fd
            except OSError as exc:
                warn(f"cannot read {path}/{sub}: {exc.strerror}")
                continue
            try:
                with os.scandir(fd) as it:
                    for de in it:
                        try:
                            st = de.stat(follow_symlinks=False)
                        except OSError:
                            continue
                        sts.append(st)
                        if de.is_dir(follow_symlinks=False):
                            if depth < MAX_TREE_DEPTH:
                                stack.append((f"{sub}/{de.name}" if sub else de.name, depth + 1))
                            elif not too_deep:
                                too_deep = True
                                warn(f"{path}: directories nested more than {MAX_TREE_DEPTH} deep (not counted below)")
            except OSError as exc:
                warn(f"cannot read {path}/{sub}: {exc.strerror}" if sub else f"cannot read {path}: {exc.strerror}")
            finally:
                if fd != top_fd:
                    os.close(fd)
    finally:
        os.close(top_fd)
    return usage_of(top, sts)


def usage_of(top: os.stat_result, sts: Iterable[os.stat_result]) -> TreeUsage:
    """The TreeUsage of the directory whose own lstat is `top`, holding the names whose lstats are `sts`
    (at any depth, directories included), as du counts it: blocks of all, the rest of what is not a
    directory; the last use is its regular files' (a link's atime is kcache's own readlink), as it was
    before kcache's own reads (readmarks.atime)."""
    size, files, apparent, newest, accessed = disk_bytes(top), 0, 0, top.st_mtime, 0.0
    for st in sts:
        size += disk_bytes(st)
        if st.st_mtime > newest:
            newest = st.st_mtime
        if stat.S_ISDIR(st.st_mode):
            continue
        files += 1
        apparent += st.st_size
        if st.st_atime > accessed and stat.S_ISREG(st.st_mode):
            accessed = max(accessed, readmarks.atime(st))
    return TreeUsage(size, files, newest, accessed, apparent, top.st_dev, top.st_ino)


def listdir(path: str | os.PathLike[str], warn: Warn, keep: Callable[[os.DirEntry], bool] | None = None
            ) -> list[os.DirEntry]:
    """Directory entries (those `keep` keeps), sorted by name; an unreadable directory is a warning and []."""
    try:
        return sorted_entries(path, keep)
    except OSError as exc:
        warn(f"cannot read {path}: {exc.strerror}")
        return []


def sort_entries(entries: Iterable[Entry], key: str) -> list[Entry]:
    if key == "size":
        return sorted(entries, key=lambda e: (-e.size, e.relpath))
    if key == "age":  # least recently used first (the larger first of those used together): prune's order
        return sorted(entries, key=lambda e: (e.last_used, -e.size, e.relpath))
    return sorted(entries, key=lambda e: (e.layout, e.op or "", e.space or "", e.relpath))


class FileInfo(NamedTuple):
    """One file of an entry: its name below the entry, size, and link target if a link."""

    name: str  # relative to the entry directory
    size: int
    link: str | None = None  # symlink target (or the text of a flattened link)


class TensorInfo(NamedTuple):
    """One tensor of an entry's task: its name, dtype and shape."""

    name: str | None
    dtype: str
    shape: tuple


class Details(NamedTuple):
    """Everything about one entry, after the deep checks that read every byte (inspect, verify)."""

    entry: Entry
    status: Status  # the scan's status, or corrupt when a deep check failed
    reason: str | None
    problems: tuple[str, ...]  # every deep-check failure, first one is also `reason`
    files: tuple[FileInfo, ...]
    task_op: str | None = None
    inputs: tuple[TensorInfo, ...] = ()
    outputs: tuple[TensorInfo, ...] = ()
    compile_command: str | None = None
    compiler_output: str | None = None
    binaries: tuple[str, ...] = ()  # absolute paths of the compiled binaries, for the ELF reader
    facts: tuple[tuple[str, str], ...] = ()  # layout-specific lines: versions, links, arch recorded...

    def to_json(self, binaries: Iterable[Any] = ()) -> dict:
        """`inspect --json`: the entry's `to_json()` with what the deep checks found; `binaries` are what
        kcache_cli.formats.binary.read_binary made of `self.binaries` (each with its own `to_json()`)."""
        bins = list(binaries)

        def tensor(t: TensorInfo) -> dict:
            return {"name": t.name, "dtype": t.dtype, "shape": list(t.shape)}

        data = self.entry.to_json()
        # machine keys for the layout's facts ("hidet version" -> hidet_version); the labels are inspect's text.
        # A label said more than once (a code shard's "code", one per kernel) keeps every value, a line each.
        facts: dict[str, str] = {}
        for label, value in self.facts:
            key = re.sub(r"[^0-9a-z]+", "_", label.lower()).strip("_")
            facts[key] = f"{facts[key]}\n{value}" if key in facts else value
        data.update(status=self.status, reason=self.reason, problems=list(self.problems),
                    op=self.entry.op or self.task_op, inputs=[tensor(t) for t in self.inputs],
                    outputs=[tensor(t) for t in self.outputs],
                    files=[{"name": f.name, "size": f.size, "link": f.link} for f in self.files],
                    compile_command=self.compile_command, compiler_output=self.compiler_output,
                    archs=sorted({a for b in bins for a in b.archs}), binaries=[b.to_json() for b in bins],
                    facts=facts)
        return data


class LogFile(NamedTuple):
    """An entry's compile log: what it is called and where it lies."""

    label: str  # "compile.sh", "nvcc_output.txt"...
    path: str
