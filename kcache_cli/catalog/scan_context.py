"""The scan context: what a layout's scan is handed (the `layouts.base.ScanContext` Protocol), with the
readers the scan engine records (kcache_cli/catalog/index.py subclasses it) and spreads over worker processes
and threads. A module of its own so that the index builds on it without importing the scan."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from stat import S_ISREG
from typing import TYPE_CHECKING, Any, Callable, Iterator

from kcache_cli.fs import dirnames
from kcache_cli.fs import read as fsread
from kcache_cli.fs import readmarks
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.model.records import (
    ENTRY_VALUES,
    Entry,
    TreeUsage,
    Warn,
    entry_from,
    entry_of,
    file_bytes,
    listdir,
    measure_tree,
)
from kcache_cli.model.terms import CORRUPT
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.progress import NO_PROGRESS, Progress

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads at its first use (a lookup of
    from kcache_cli.fs import mounts  # one entry starts no worker and may ask no mount)
    from kcache_cli.util import parallel
else:
    mounts = lazy_module("kcache_cli.fs.mounts")
    parallel = lazy_module("kcache_cli.util.parallel")


@dataclass
class ScanContext:
    """What a layout's scan needs: the root, where warnings go, and last-used stamps."""

    root: Path
    warn: Warn
    last_used: dict[str, float] = field(default_factory=dict)
    # When a dict, read_dir puts each directory's own stat and its files' (name, stat) in it, taken
    # before anything is judged: the index (kcache_cli/catalog/index.py) keys its records with them.
    recording: dict | None = field(default=None, init=False, repr=False, compare=False)
    # False when the caller shows no status (`log`): what a judgement takes from the whole cache (hidet's
    # version in use) is not looked up, so an entry that is stale may come back complete.
    statuses: bool = field(default=True, repr=False, compare=False)
    # Told the entries found so far (start) and each one judged (advance): a scan's counting bar.
    progress: Progress = field(default=NO_PROGRESS, repr=False, compare=False)
    found: int = field(default=0, init=False, repr=False, compare=False)
    mapped: bool = field(default=False, init=False, repr=False, compare=False)  # map_entries counted them

    def __post_init__(self) -> None:
        self._prefix = os.path.join(str(self.root), "")
        self._reads: Callable[[str], bool] | None = None  # mounts.AtimeRule of the root, made when first asked
        self._anchor: fsread.Anchor | None = None

    @property
    def anchor(self) -> fsread.Anchor | None:
        """The root held open, that entry directories are opened from (None when it cannot be opened)."""
        if self._anchor is None or self._anchor.fd < 0:
            self._anchor = fsread.anchor(self.root)
        return self._anchor

    def open_entry(self, path: str) -> EntryDir:
        """The entry directory `path` held open from the root (no link on the way followed), for its
        judgement to read through: `with ctx.open_entry(path) as d:`."""
        return EntryDir.open(path, self.anchor)

    def reads_recorded(self, path: str) -> bool:
        """Whether the mount holding `path` records reads in atime (not `noatime`)."""
        if self._reads is None:
            self._reads = mounts.AtimeRule(self.root)
        return self._reads(path)

    def note_found(self, n: int) -> None:
        """`n` more entries found (to be judged): the bar's total grows."""
        self.found += n
        self.progress.start(self.found)

    def rel(self, path: str) -> str:
        # Paths handed out by the scan are built from the root: slicing beats os.path.relpath 50x.
        if path.startswith(self._prefix):
            return path[len(self._prefix):]
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def entry(self, *, path: str, usage: TreeUsage, subdirs: int = -1, **fields) -> Entry:
        """The Entry at `path` measured as `usage`, holding `subdirs` directories (-1: not counted)."""
        rel = self.rel(path)
        fields.update(path=path, relpath=rel, size=usage.size, apparent_size=usage.apparent, files=usage.files,
                      modified=usage.mtime, last_used=self.last_used_of(rel, usage.mtime, usage.atime, path),
                      dev=usage.dev, ino=usage.ino, subdirs=subdirs)
        return entry_of(fields)

    def last_used_of(self, relpath: str, modified: float, accessed: float = 0.0, path: str = "") -> float:
        """The newest of kcache's last-used stamp, the entry's newest mtime and, where the mount records
        reads, its files' newest atime (a compiler's hit reads them and writes nothing)."""
        used = max(self.last_used.get(relpath, 0.0), modified)
        if accessed > used and self.reads_recorded(path):
            return accessed
        return used

    def link_entry(self, path: str, where: str = "inside the cache", **fields) -> Entry:
        """A symlink where a directory of the cache belongs: listed as a corrupt entry, never followed."""
        st = fsread.stat_path(path, follow=False)
        try:
            text = fsread.readlink(path)
        except OSError:
            text = "?"
        usage = TreeUsage(file_bytes(st), 1, st.st_mtime, 0.0, st.st_size, st.st_dev, st.st_ino)
        return self.entry(path=path, usage=usage, status=CORRUPT,
                          reason=f"symlink to {text} {where} (never followed)", **fields)

    def listdir(self, path: str | Path, keep: Callable[[os.DirEntry], bool] | None = None) -> list[os.DirEntry]:
        return listdir(path, self.warn, keep)

    def subdirs(self, path: str | Path, prefixes: tuple[str, ...] = ()) -> list[str]:
        """The names of the real subdirectories of `path` (links are not), sorted; an unreadable directory
        is a warning and []. From the listing kept while the directory is unchanged (fs/dirnames.py);
        with `prefixes`, only the names that start with one, each then lstat'ed."""
        try:
            if not prefixes:  # kept or listed here, and kept at the scan's end (catalog/scan.py)
                return dirnames.of(self.root).subdirs(str(path))
            return _subdirs_starting(str(self.root), str(path), prefixes)
        except FileNotFoundError:
            return []
        except OSError as exc:
            self.warn(f"cannot read {path}: {exc.strerror}")
            return []

    def links(self, path: str | Path) -> list[str]:
        """The names of the symbolic links in `path`, sorted, from the listing kept while it is unchanged
        (a directory without one decodes no name: fs/dirnames.py); an unreadable directory is a warning
        and []."""
        try:
            return dirnames.of(self.root).links(str(path))
        except OSError as exc:
            self.warn(f"cannot read {path}: {exc.strerror}")
            return []

    def map_entries(self, func, jobs: list, unfiltered: Callable | None = None,
                    meanwhile: Callable[[], None] | None = None) -> Iterator[Entry]:
        """`func(self, job)` for every job, in order. Big caches are read by one worker process per
        core (kcache_cli.util.parallel): the per-file stat calls are what a scan costs, and they scale with
        cores. `func` must be a module-level function. `unfiltered(job)`: the job without its op and
        target filter, and that filter (for the index: IndexedContext). `meanwhile()`: run here while workers read
        (parallel.map_parts); never when the jobs are done here."""
        self.mapped = True
        self.note_found(len(jobs))
        workers = parallel.cpus() if len(jobs) >= PARALLEL_MIN_JOBS else 1
        if workers < 2:
            yield from self._map_here(func, jobs)
            return
        try:
            claims = parallel.Claims(len(jobs), _BLOCK)
            try:
                results = parallel.map_parts(_packed_part, (self.root, self.last_used, func, jobs),
                                             [claims.share(i, workers) for i in range(workers)],
                                             progress=self.progress, meanwhile=meanwhile, here=_part_here)
            finally:
                claims.close()
        except (OSError, RuntimeError, ImportError):  # no fork, no semaphores: read them here instead
            yield from self._map_here(func, jobs)
            return
        for _, warnings, _, _ in results:
            for w in warnings:
                self.warn(w)
        readmarks.put_moved([m for _, _, moved, _ in results for m in moved])
        self.kept_by_workers([kept for *_, kept in results if kept is not None])
        yield from _placed(len(jobs), claims.block, [(starts, _unpacked(*part)) for (starts, *part), *_ in results])

    def kept_by_workers(self, kept: list) -> None:
        """What the workers' `func.end_part()` handed back (_packed_part), one item per worker that kept
        something: the index's records (IndexedContext); a plain scan keeps nothing."""

    def _map_here(self, func, jobs: list) -> Iterator[Entry]:
        for job in jobs:
            out = func(self, job)
            self.progress.advance(1)
            yield out

    def read_dir(self, where: str | EntryDir, quiet: bool = False
                 ) -> tuple[dict[str, int] | None, TreeUsage, dict[str, float]]:
        """Top-level file sizes by name, the usage of the whole entry (subdirectories included), and
        the top-level files' mtimes.

        Sizes are None when the directory cannot be read (a warning says why). Works relative to an
        open directory descriptor (fstatat, like du) rather than re-walking the full path per file.
        Given the entry's EntryDir, it lists through its fd and keeps each lstat in its `listing` (the
        judgement's reads then skip their own stat). `quiet`: no warning when it cannot be read (another
        user's build in flight: private by design)."""
        if not isinstance(where, EntryDir):
            with EntryDir.open(where) as d:
                return self.read_dir(d, quiet)
        if where.fd is None:
            if where.error is not None and not isinstance(where.error, FileNotFoundError) and not quiet:  # gone
                self.warn(f"cannot read {where.path}: {where.error.strerror}")
            try:
                newest = fsread.stat_path(where.path, follow=False).st_mtime
            except OSError:
                newest = 0.0
            return None, TreeUsage(0, 0, newest), {}
        try:
            return self._list_entry(where)
        except OSError as exc:
            if not quiet:
                self.warn(f"cannot read {where.path}: {exc.strerror}")
            return None, TreeUsage(0, 0, 0.0), {}

    def _list_entry(self, d: EntryDir) -> tuple[dict[str, int], TreeUsage, dict[str, float]]:
        """read_dir of the open entry directory `d` (OSError when it cannot be listed)."""
        names: dict[str, int] = {}
        mtimes: dict[str, float] = {}
        files, apparent, accessed = 0, 0, 0.0
        listing = d.listing
        dir_stat = os.fstat(d.fd)  # type: ignore[arg-type]  # read_dir checked it is open
        newest, size = dir_stat.st_mtime, dir_stat.st_blocks * 512
        stats: list | None = [] if self.recording is not None else None
        with os.scandir(d.fd) as it:
            for de in it:
                try:
                    if de.is_dir(follow_symlinks=False):
                        stats = None  # subdirectories are not recorded: such an entry is not indexed
                        sub = measure_tree(os.path.join(d.path, de.name), self.warn)
                        size, files, apparent = size + sub.size, files + sub.files, apparent + sub.apparent
                        newest, accessed = max(newest, sub.mtime), max(accessed, sub.atime)
                        continue
                    st = de.stat(follow_symlinks=False)
                except OSError:
                    continue
                if stats is not None:
                    stats.append((de.name, st))
                listing[de.name] = st
                names[de.name] = st.st_size
                mtime = mtimes[de.name] = st.st_mtime
                size += st.st_blocks * 512 // (st.st_nlink or 1)  # file_bytes, inline: a hard link counts its share
                apparent += st.st_size
                files += 1
                if mtime > newest:
                    newest = mtime
                if st.st_atime > accessed and S_ISREG(st.st_mode):  # not a link: readlink sets its atime
                    accessed = max(accessed, readmarks.atime(st))  # not kcache's own reads
        if self.recording is not None:
            self.recording[d.path] = (dir_stat, stats) if stats is not None else None
        return names, TreeUsage(size, files, newest, accessed, apparent, dir_stat.st_dev, dir_stat.st_ino), mtimes


PARALLEL_MIN_JOBS = 4000
# Jobs are claimed by the workers this many at a time (parallel.Claims): a 100,000-entry hidet listing from
# the index made 27,000 fewer copies of pages (-3% wall) than dealing them one at a time.
_BLOCK = 256


# Threads per worker process. A cache not read for a while is on disk, not in the page cache (and
# reclaim evicts it): each worker then waits on directory, inode and header reads, which release the GIL,
# so a few threads keep several reads in flight where one would wait for each in turn. In the page cache
# (or on a loaded machine) they only contend for the GIL, so they start only once entries are seen to wait
# on the disk (blocked_time: not on a CPU, not waiting for one): blocks of PROBE entries are timed, and
# WINDOW blocks in a row blocked SLOW seconds per entry on average (a cached entry blocks on nothing) start
# them. An average, as reads from disk come in bursts
# (a block of inodes read serves the next entries) and a garbage collection is one slow block.
THREADS_PER_WORKER = 4
PROBE = 64
WINDOW = 4
SLOW = 150e-6
_SCHEDSTAT = "/proc/thread-self/schedstat"  # this thread's ns on a CPU, ns waiting for one, timeslices


def blocked_time() -> float:
    """Seconds (from an arbitrary start) this thread spent neither on a CPU nor waiting for one: waiting on
    the disk. A shared machine's load makes entries slow too, and threads would only fight over the GIL
    then: the wall clock less the thread's CPU time and its wait in the run queue, where /proc tells it
    (less the CPU time alone where not)."""
    try:
        with open(_SCHEDSTAT, "rb") as f:
            run_ns, wait_ns = f.read().split()[:2]
        return time.perf_counter() - (int(run_ns) + int(wait_ns)) / 1e9
    except (OSError, ValueError):
        return time.perf_counter() - time.thread_time()


# The clock the blocks are timed by (tests drive a virtual one: no test depends on this machine's speed).
clock: Callable[[], float] = blocked_time


def _scan_part(shared: tuple, share: parallel.ClaimShare) -> tuple[list[int], list[Any], list[str]]:
    """One worker's share of a scan: the starts of the blocks of jobs it claimed (share.take), in the order
    taken, their results in that order, and the warnings they raised; read by one thread, or by
    THREADS_PER_WORKER once reads are seen to wait on the disk (each thread with its own context: the
    index records per context). Threads take the next PROBE jobs from the blocks claimed (_Taking)."""
    root, last_used, func, jobs = shared
    fsread.anchor(root)  # a forkserver's worker starts without the parent's anchors
    readmarks.in_worker(root)  # ... and without the notes of kcache's reads, nor whose files its reads are
    out: list[Any] = [None] * len(jobs)
    warned: list[str] = []
    failed: list[BaseException] = []
    taking = _Taking(share, len(jobs))

    def work(limit: float | None = None) -> bool:
        """Take jobs until none is left (False) or, with `limit`, until the last WINDOW blocks of PROBE
        jobs took more than `limit` seconds per job (True: the disk is slow, and jobs are left)."""
        local = ScanContext(root, warned.append, last_used)
        window: deque[float] = deque(maxlen=WINDOW)
        first = True  # the first block pays for imports and first calls: not timed
        try:
            while not failed:
                started = clock()
                block = taking.next(PROBE)
                for i in block:
                    out[i] = func(local, jobs[i])
                parallel.advance(len(block))  # a block at once: the bar moves every 0.1 s anyway
                if len(block) < PROBE:  # none left
                    return False
                if limit is None or first:
                    first = False
                    continue
                window.append(clock() - started)
                if len(window) == WINDOW and sum(window) > limit * PROBE * WINDOW:
                    return True
        except BaseException as exc:  # noqa: BLE001 - raised again below, in the worker's own thread
            failed.append(exc)
        return False

    slow = work(SLOW if THREADS_PER_WORKER > 1 else None)
    threads = [threading.Thread(target=work) for _ in range(THREADS_PER_WORKER - 1)] if slow else []
    for th in threads:
        th.start()
    if slow:
        work()
    for th in threads:
        th.join()
    if failed:
        raise failed[0]
    size = share.block
    return taking.starts, [out[i] for s in taking.starts for i in range(s, min(s + size, len(jobs)))], warned


class _Taking:
    """The jobs of one process's blocks (its ClaimShare), handed to its threads PROBE at a time."""

    def __init__(self, share: parallel.ClaimShare, n: int) -> None:
        self.share, self.n = share, n
        self.starts: list[int] = []  # of the blocks claimed, in the order claimed
        self.left: deque[int] = deque()
        self.lock = threading.Lock()

    def next(self, k: int) -> list[int]:
        """The next `k` jobs claimed, fewer only when no block is left."""
        with self.lock:
            while len(self.left) < k:
                start = self.share.take()
                if start is None:
                    break
                self.starts.append(start)
                self.left.extend(range(start, min(start + self.share.block, self.n)))
            return [self.left.popleft() for _ in range(min(k, len(self.left)))]


def _placed(n: int, block: int, parts: list[tuple[list[int], list]]) -> list:
    """The results of `n` jobs in their order, from each process's (starts of its blocks, their results)."""
    out: list[Any] = [None] * n
    for starts, results in parts:
        at = 0
        for s in starts:
            end = min(s + block, n)
            out[s:end] = results[at:at + end - s]
            at += end - s
    return out


_Part = tuple[tuple[list[int], list, bytes], list[str], list[tuple[str, int, int, int]], Any]


def _packed_part(shared: tuple, share: parallel.ClaimShare) -> _Part:
    """_scan_part, the results packed for the trip back to the parent (_packed: the starts of the blocks,
    the results, the marks of the Entries), with what its reads moved (readmarks.take_moved: the parent
    notes them with its own) and what `func` kept in this worker for the parent (`func.begin_part()` before
    the jobs, `func.end_part()` after: the index's records, pickled once here), None when it keeps nothing."""
    return _part(shared, share, True)


def _part_here(shared: tuple, share: parallel.ClaimShare) -> _Part:
    """_packed_part run in the parent (parallel.map_parts' `here`): its Entries as they are, none marked."""
    return _part(shared, share, False)


def _part(shared: tuple, share: parallel.ClaimShare, pack: bool) -> _Part:
    func = shared[2]
    begin, end = getattr(func, "begin_part", None), getattr(func, "end_part", None)
    if begin is not None:
        begin()
    starts, out, warned = _scan_part(shared, share)
    return ((starts, *(_packed(out) if pack else (out, b""))), warned, readmarks.take_moved(),
            end() if end is not None else None)


def _packed(results: list) -> tuple[list, bytes]:
    """A worker's results for the trip back: each Entry as the tuple of its field values (pickled in a
    third of the time: no class, no per-field names), marked in the bytes that come with them."""
    marks = bytearray(len(results))
    for i, x in enumerate(results):
        if type(x) is Entry:
            results[i], marks[i] = ENTRY_VALUES(x.__dict__), 1
    return results, bytes(marks)


def _unpacked(results: list, marks: bytes) -> list:
    """The worker's results as it made them: Entries again (records.entry_from: a frozen dataclass's
    __init__ costs 4x)."""
    for i in (i for i, m in enumerate(marks) if m):
        results[i] = entry_from(results[i])
    return results


def _subdirs_starting(root: str, path: str, prefixes: tuple[str, ...]) -> list[str]:
    """ScanContext.subdirs of `path` with `prefixes`."""
    kept = dirnames.of(root)
    found = kept.subdirs_starting(path, prefixes)
    kept.save()
    return found
