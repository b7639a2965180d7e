"""Deleting safely: selection -> a frozen `DeletePlan` (what goes, why, the bytes it
frees: that *is* the dry run) -> `DeletePlan.execute()`.

Executing a plan, for each removal: hold kcache's entry lock (`.kcache/locks/`, non-blocking: a build
in progress means skip) and the lock files the entry's own writer holds (Layout.writer_locks: hidet's
`.lock`), reach the parent directory from the
root without following a symlink, rename the entry into `.kcache/trash/` (same filesystem: a reader
sees the whole entry or nothing), then empty the trash. Symlinks are renamed and unlinked as links,
never followed. A later run empties trash that an interrupted run left behind."""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterable

from kcache_cli import state
from kcache_cli.errors import KcacheError, UsageError
from kcache_cli.model import (BUILDING, COMPLETE, CORRUPT, FAILED, PARTIAL, STALE, UNREADABLE, Entry, ScanFilter, Warn,
                              iso, measure_tree)
from kcache_cli.scan import listdir

STALE_AFTER = 3600.0  # temp and staging directories untouched for an hour belong to no live writer
BROKEN = (PARTIAL, FAILED, CORRUPT, STALE)  # never UNREADABLE: a permission problem is not damage
# What a removal takes away.
ENTRY, CANDIDATES, TEMP, STAGING, LINK = "entry", "candidates", "temp", "staging", "link"
GC_LOCK = ".gc.lock"  # in .kcache/locks/: one prune or clear acts on a root at a time



from kcache_cli.units import format_age, parse_age, parse_size  # noqa: E402,F401 - the one grammar (units.py)


# ---- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Removal:
    """One thing a plan removes: a whole entry, an entry's leftover candidates/, a stale temp or
    staging directory, or a symlink."""

    entry: Entry  # the entry as scanned (for candidates/: the entry that keeps living)
    path: str  # absolute path of what goes
    relpath: str
    size: int
    what: str  # ENTRY, CANDIDATES, TEMP, STAGING or LINK
    why: str
    lock: str | None = None  # relpath whose kcache entry lock is held while renaming
    requires: tuple[str, ...] = ()  # relpaths that must be gone first (a program's scripts, a binary's kernels)
    recheck: bool = False  # chosen for being broken: skipped if it is complete by the time it is removed

    def to_json(self) -> dict:
        d = self.entry.to_json()
        d.update(removed_path=self.path, size=self.size, what=self.what, why=self.why)
        return d


@dataclass(frozen=True)
class Skip:
    """Something the selection chose that stays, and why (a build holds its lock, a kept script links to it...)."""

    entry: Entry
    why: str

    def to_json(self) -> dict:
        d = self.entry.to_json()
        d["why"] = self.why
        return d


@dataclass(frozen=True)
class DeleteResult:
    root: str
    removed: tuple[Removal, ...]
    skipped: tuple[Skip, ...]
    errors: tuple[tuple[str, str], ...]  # (path, message)
    freed: int
    removed_dirs: tuple[str, ...] = ()  # parent directories left empty and removed
    warnings: tuple[str, ...] = ()

    @property
    def entries(self) -> int:
        return sum(1 for r in self.removed if r.what != CANDIDATES)


@dataclass(frozen=True)
class DeletePlan:
    """What a prune or clear will remove. Building it changes nothing: it is the dry run."""

    root: str
    exists: bool
    removals: tuple[Removal, ...] = ()
    skipped: tuple[Skip, ...] = ()
    scanned_size: int = 0  # bytes in the entries scanned (the whole cache for prune)
    warnings: tuple[str, ...] = ()
    tidy_state: bool = False  # also drop last-used stamps and idle lock files of entries that are gone

    @property
    def expected_freed_size(self) -> int:
        return sum(r.size for r in self.removals)

    @property
    def size_after(self) -> int:
        return self.scanned_size - self.expected_freed_size

    @property
    def entries(self) -> int:
        return sum(1 for r in self.removals if r.what != CANDIDATES)

    def execute(self, progress: Callable[[Removal], None] | None = None,
                on_wait: Callable[[], None] | None = None) -> DeleteResult:
        if not self.exists:
            return DeleteResult(self.root, (), self.skipped, (), 0, (), self.warnings)
        return _Executor(self, progress, on_wait).run()


# ---- selection -----------------------------------------------------------------------------------
def _layout(e: Entry):
    from kcache_cli.layouts import get

    return get(e.layout)


def _provides(e: Entry) -> bool:
    """An entry others use (a tilus program, a tilelang binary): removed after its users, kept while a
    user stays (Layout.provider_kinds)."""
    return e.kind in _layout(e).provider_kinds


def _judged(root: Path, e: Entry) -> Entry:
    """`e` with the one deep judgement (verify's), which reads every byte: what ls's cheap checks call
    broken stays broken; what they call complete may not be."""
    if e.status in BROKEN:
        return e
    from dataclasses import replace

    from kcache_cli.verify import judge_entry

    j = judge_entry(root, e, deep=True)
    return e if j.status == e.status else replace(e, status=j.status, reason=j.reason)


def _unlisted(e: Entry) -> bool:
    """A directory the scan could not list, standing for the entries in it: never removed."""
    return e.status == UNREADABLE and not e.hash


def _is_leftover(e: Entry) -> bool:
    """What an interrupted writer left (a kcache build's temp dir, a staging write), rather than an entry."""
    return _layout(e).leftover(e) is not None


class _Planner:
    """Collects removals and skips; applies the rules that tie entries together."""

    def __init__(self, root: Path, warn: Warn, now: float, everything: dict[str, Entry] | None = None):
        self.root = Path(root)
        self.warn = warn
        self.now = now
        self.removals: dict[str, Removal] = {}  # path -> removal, in selection order
        self.skipped: dict[str, Skip] = {}
        self.known: dict[str, Entry] = dict(everything or {})  # path -> entry, for entries outside the selection
        self._users: dict[str, list[str]] = {}  # provider path -> paths of the entries that use it
        self._dirs_ok: dict[str, str | None] = {}

    # -- relationships between entries (the layouts' dependency edges)
    def learn_users(self, providers: list[Entry]) -> None:
        """Learn which entries use each of `providers` (one pass per layout for all of them)."""
        todo: dict[str, list[str]] = {}
        for e in providers:
            if e.path not in self._users and _provides(e):
                todo.setdefault(e.layout, []).append(e.path)
        for layout, paths in todo.items():
            from kcache_cli.layouts import get

            self._users.update(get(layout).users(self.root, paths))

    def dependants(self, e: Entry) -> list[str]:
        """Paths of the entries that use `e` (the scripts of a tilus program, the kernels of a tilelang binary)."""
        if not _provides(e):
            return []
        self.learn_users([e])
        return self._users.get(e.path, [])

    def take_users(self, e: Entry) -> list[Removal]:
        """A broken provider that goes takes the entries using it along when they cannot work without it
        (Layout.users_break: tilus scripts link to their programs)."""
        added: list[Removal] = []
        if e.status == COMPLETE or not _layout(e).users_break(e.kind):
            return added
        verb = _layout(e).use_words(e.kind)[0]
        for s in self.dependants(e):
            if s not in self.removals:
                added += self.select(self.entry_at(s, e.layout), f"{verb} the removed {e.kind} {e.hash}")
        return added

    def kept_users(self, e: Entry, kept: list[str]) -> str:
        """Why a provider stays: "linked from the kept script scripts/x/y and 2 more"."""
        from kcache_cli.layouts import get

        rel = self.rel(kept[0])
        where = get(e.layout).shape.locate(rel)
        more = f" and {len(kept) - 1} more" if len(kept) > 1 else ""
        return f"{_layout(e).use_words(e.kind)[1]} the kept {where[0] if where else 'entry'} {rel}{more}"

    def entry_at(self, path: str, layout: str) -> Entry:
        e = self.known.get(path)
        if e is None:
            from kcache_cli.scan import scan_cache

            for x in scan_cache(self.root, ScanFilter(layouts=(layout,))).entries:
                self.known.setdefault(x.path, x)
            e = self.known.get(path)
        if e is None:  # vanished since: a stand-in that still names it
            from kcache_cli.layouts import get

            where = get(layout).shape.locate(self.rel(path))
            e = Entry(layout, where[0] if where else "entry", None, None, None, os.path.basename(path), path,
                      self.rel(path), 0, 0, PARTIAL, "vanished", 0.0, 0.0)
        return e

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.root).replace(os.sep, "/")

    def link_in_path(self, relpath: str) -> str | None:
        """The first directory above `relpath` that is a symlink (or not a directory), or None."""
        return self._bad_dir(relpath.rpartition("/")[0])

    def _bad_dir(self, rel: str) -> str | None:
        """`rel` or the first of its ancestors that is not a real directory (memoized per directory)."""
        if not rel:
            return None
        if rel not in self._dirs_ok:
            bad = self._bad_dir(rel.rpartition("/")[0])
            if bad is None:
                try:
                    bad = None if stat.S_ISDIR(os.lstat(self.root / rel).st_mode) else rel
                except OSError:
                    bad = rel
            self._dirs_ok[rel] = bad
        return self._dirs_ok[rel]

    # -- choosing
    def skip(self, e: Entry, why: str) -> None:
        self.skipped.setdefault(e.path, Skip(e, why))

    def select(self, e: Entry, why: str, recheck: bool = False, link: bool = False) -> list[Removal]:
        """Plan to remove `e` (or skip it, with the reason). Returns what was added."""
        if e.path in self.removals:
            return []
        via = self.link_in_path(e.relpath)
        if via is not None:
            if not any(r.what == LINK and (via == r.relpath or via.startswith(r.relpath + "/"))
                       for r in self.removals.values()):
                self.skip(e, f"reached through the symlink {via}: never followed out of the cache")
            return []
        if e.status == BUILDING:
            self.skip(e, "a build holds its lock (in progress)")
            return []
        if _is_leftover(e):
            return self._select_leftover(e)
        if link:
            r = Removal(e, e.path, e.relpath, e.size, LINK, why)
        else:
            r = Removal(e, e.path, e.relpath, e.size, ENTRY, why, lock=e.relpath, recheck=recheck)
        self.removals[e.path] = r
        self.skipped.pop(e.path, None)
        return [r]

    def _select_leftover(self, e: Entry) -> list[Removal]:
        layout = _layout(e)
        added = []
        for x in layout.leftover_parts(e, self.warn):  # one per write (tilelang's .staging/cuda-binaries/)
            left = layout.leftover(x) or layout.leftover(e)
            assert left is not None, "a part of a leftover is a leftover"
            if self.now - x.modified < STALE_AFTER:
                self.skip(x, "in flight: written to less than an hour ago")
                continue
            r = Removal(x, x.path, x.relpath, x.size, left.what, left.why, lock=left.lock)
            self.removals[x.path] = r
            added.append(r)
        return added

    def drop(self, path: str) -> None:
        self.removals.pop(path, None)

    # -- the rules that tie entries together
    def settle(self) -> None:
        """A broken provider that goes takes the users that cannot work without it along (tilus scripts);
        a complete provider still used by an entry that stays, stays (tilus programs, tilelang binaries)."""
        for r in list(self.removals.values()):
            if r.what == ENTRY:
                self.take_users(r.entry)
        self.learn_users([r.entry for r in self.removals.values() if r.what == ENTRY])
        for r in list(self.removals.values()):
            if r.what != ENTRY or not _provides(r.entry):
                continue
            deps = self.dependants(r.entry)
            kept = [d for d in deps if d not in self.removals]
            if kept and r.entry.status == COMPLETE:
                self.drop(r.path)
                self.skip(r.entry, self.kept_users(r.entry, kept))
            elif deps:
                self.removals[r.path] = replace(r, requires=tuple(self.rel(d) for d in deps if d in self.removals))

    def effective_last_used(self, e: Entry, by_path: dict[str, Entry]) -> float:
        """An entry used through another one (a tilus program through its scripts, a tilelang binary
        through its kernels) was last used when they were."""
        t = e.last_used
        for d in self.dependants(e):
            o = by_path.get(d)
            if o is not None:
                t = max(t, o.last_used)
        return t

    def plan(self, exists: bool, scanned: int, warnings: Iterable[str], tidy: bool = False) -> DeletePlan:
        order = sorted(self.removals.values(), key=lambda r: _provides(r.entry))  # users first
        return DeletePlan(str(self.root), exists, tuple(order), tuple(self.skipped.values()), scanned,
                          tuple(warnings), tidy)



def _strays(root: Path, flt: ScanFilter, warn: Warn, layouts: Iterable[str]) -> list[Entry]:
    from kcache_cli.layouts import get
    from kcache_cli.scan import ScanContext

    ctx = ScanContext(Path(root), warn, {})
    out = []
    for name in layouts:
        if not flt.layouts or name in flt.layouts:
            out.extend(e for e in get(name).stray_links(ctx, flt) if flt.matches(e))
    return out


def _collector(warn: Warn | None) -> tuple[list[str], Warn]:
    msgs: list[str] = []

    def collect(m: str) -> None:
        msgs.append(m)
        if warn is not None:
            warn(m)

    return msgs, collect


def plan_clear(root: Path, flt: ScanFilter, everything: bool = False, warn: Warn | None = None,
               now: float | None = None) -> DeletePlan:
    """Remove the entries `flt` selects (everything with `everything`), within the rules: skip builds in
    progress, keep tilus programs and tilelang binaries that kept entries use."""
    from kcache_cli.scan import scan_cache

    if not everything and flt == ScanFilter():
        raise UsageError("clear needs a selection: --space, --op, --target, --layout, hash prefixes, or --all")
    root = Path(root)
    msgs, collect = _collector(warn)
    result = scan_cache(root, flt, collect)
    if not result.exists:
        return DeletePlan(str(root), False, warnings=tuple(msgs))
    p = _Planner(root, collect, time.time() if now is None else now)
    for s in _strays(root, flt, collect, result.layouts):
        p.select(s, "selected (a symlink: removed as a link)", link=True)
    for e in result.entries:
        if _unlisted(e):
            p.skip(e, e.reason or "unreadable")
            continue
        p.select(e, "selected")
    p.settle()
    return p.plan(True, result.size, msgs)


def plan_prune(root: Path, max_size: int | None = None, older_than: float | None = None, broken: bool = False,
               warn: Warn | None = None, now: float | None = None) -> DeletePlan:
    """What is safe and useful to remove: always stale temp/staging directories and the leftovers the
    layouts name inside entries (hidet's candidates/); with `broken`, partial, failed and corrupt entries;
    with `older_than` (seconds), entries unused for that long; with `max_size` (bytes), least recently
    used entries until the cache fits."""
    from kcache_cli.scan import scan_cache

    root = Path(root)
    now = time.time() if now is None else now
    msgs, collect = _collector(warn)
    result = scan_cache(root, ScanFilter(), collect)
    if not result.exists:
        return DeletePlan(str(root), False, warnings=tuple(msgs))
    entries = tuple(e for e in result.entries if not _unlisted(e))
    by_path = {e.path: e for e in entries}
    p = _Planner(root, collect, now, by_path)
    leftovers = [e for e in entries if _is_leftover(e)]
    regular = [e for e in entries if not _is_leftover(e)] if leftovers else list(entries)
    for e in leftovers:  # 1. always: what interrupted writers left behind
        if e.status == BUILDING:
            p.skip(e, "a build holds its lock (in progress)")
        else:
            p.select(e, "stale")
    if broken:  # 2. broken entries (and symlinks where entries belong)
        _select_broken(p, root, regular, collect, result.layouts)
    p.learn_users(regular)  # 3. unused for too long (a provider is used when its users are)
    last = {e.path: p.effective_last_used(e, by_path) for e in regular}
    if older_than is not None:
        for e in regular:
            if now - last[e.path] > older_than and e.path not in p.removals:
                p.select(e, f"unused for {format_age(now - last[e.path])}")
    p.settle()
    inner = _select_inner_leftovers(p, regular, collect)  # 4. leftovers inside entries that stay
    if max_size is not None:  # 5. least recently used first, until the cache fits
        _select_until_fits(p, regular, last, inner, result.size, max_size)
    return p.plan(True, result.size, msgs, tidy=True)


def _select_broken(p: _Planner, root: Path, regular: list[Entry], warn: Warn, layouts: Iterable[str]) -> None:
    for s in _strays(root, ScanFilter(), warn, layouts):
        p.select(s, "a symlink where an entry belongs: removed as a link", link=True)
    for e in regular:
        e = _judged(root, e)
        if e.status in BROKEN:
            p.select(e, f"broken: {e.reason or e.status}", recheck=True)


def _select_inner_leftovers(p: _Planner, regular: list[Entry], warn: Warn) -> dict[str, list[Removal]]:
    """Directories the layouts name as removable inside entries that stay; entry path -> their removals."""
    out: dict[str, list[Removal]] = {}
    for e in regular:
        if e.path in p.removals:
            continue
        for left in _layout(e).inner_leftovers(e):
            path = os.path.join(e.path, left.name)
            if not os.path.isdir(path) or os.path.islink(path):
                continue
            if e.status == BUILDING:
                p.skip(e, left.busy)
                continue
            u = measure_tree(path, warn)
            r = Removal(e, path, f"{e.relpath}/{left.name}", u.size, CANDIDATES, left.why, lock=e.relpath)
            p.removals[path] = r
            out.setdefault(e.path, []).append(r)
    return out


def _select_until_fits(p: _Planner, regular: list[Entry], last: dict[str, float], inner: dict[str, list[Removal]],
                       size: int, max_size: int) -> None:
    """Least recently used entries (users before the providers they use) until `size` fits `max_size`."""
    remaining = size - sum(r.size for r in p.removals.values())
    for e in sorted(regular, key=lambda e: (last[e.path], _provides(e), e.relpath)):
        if remaining <= max_size:
            break
        if e.path in p.removals:
            continue
        if _provides(e) and e.status == COMPLETE:
            kept = [d for d in p.dependants(e) if d not in p.removals]
            if kept:
                p.skip(e, f"used by {p.rel(kept[0])}, which stays")
                continue
        via = "" if last[e.path] == e.last_used else f" (its users last used it {iso(last[e.path])})"
        added = p.select(e, f"least recently used{via}")
        if added:
            added += p.take_users(e)
        for r in added:
            remaining -= r.size
            for left in inner.pop(r.path, ()):  # the entry's size already counts them
                p.drop(left.path)
                remaining += left.size
        if added and _provides(e):
            deps = [d for d in p.dependants(e) if d in p.removals]
            if deps:
                p.removals[e.path] = replace(p.removals[e.path], requires=tuple(p.rel(d) for d in deps))


# ---- acting --------------------------------------------------------------------------------------
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _flock(fd: int) -> bool:
    from kcache_cli.locking import try_flock

    return try_flock(fd)


class _Executor:
    def __init__(self, plan: DeletePlan, progress, on_wait):
        self.plan = plan
        self.root = Path(plan.root)
        self.progress = progress
        self.on_wait = on_wait
        self.removed: list[Removal] = []
        self.skipped: list[Skip] = list(plan.skipped)
        self.errors: list[tuple[str, str]] = []
        self.warnings: list[str] = list(plan.warnings)
        self.gone: set[str] = set()  # relpaths removed by this run
        self.dir_fds: dict[str, int] = {}
        self.pinned: dict[str, int] = {}  # root and .kcache/*: open for the whole run
        self.used_fd: int | None = None

    # -- directories reached without following symlinks
    def _dir_fd(self, relpath: str) -> int:
        """An fd for the directory `relpath` under the root, opened component by component with
        O_NOFOLLOW: a symlink anywhere on the way raises instead of being followed. Valid until the
        next call (the cache of open directories is bounded)."""
        fd = self.pinned.get(relpath, self.dir_fds.get(relpath))
        if fd is not None:
            return fd
        head, _, name = relpath.rpartition("/")
        fd = os.open(name, _DIR_FLAGS, dir_fd=self._dir_fd(head))
        if len(self.dir_fds) >= 256:
            self._close_dirs()
        self.dir_fds[relpath] = fd
        return fd

    def _close_dirs(self) -> None:
        for fd in self.dir_fds.values():
            os.close(fd)
        self.dir_fds.clear()

    def _pin(self, relpath: str, create: bool) -> int:
        """.kcache/ and its subdirectories: created if asked, never through a symlink, open for the run."""
        head, _, name = relpath.rpartition("/")
        parent = self.pinned[head]
        if create:
            try:
                os.mkdir(name, 0o755, dir_fd=parent)
            except FileExistsError:
                pass
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        self.pinned[relpath] = fd
        return fd

    def run(self) -> DeleteResult:
        sd = state.STATE_DIR
        if not self.plan.removals and not os.path.isdir(self.root / sd):
            return DeleteResult(self.plan.root, (), tuple(self.skipped), (), 0, (), tuple(self.warnings))
        try:
            self.pinned[""] = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            self._pin(sd, create=True)
            locks_fd = self._pin(f"{sd}/locks", create=True)
            trash_fd = self._pin(f"{sd}/trash", create=True)
            gc = os.open(GC_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=locks_fd)
        except OSError as exc:
            self._close_all()
            raise KcacheError(f"cannot write to {self.root / sd}: {exc.strerror or exc}; nothing was removed")
        try:
            self.used_fd = self._pin(f"{sd}/used", create=False)
        except OSError:
            self.used_fd = None
        removed_dirs: list[str] = []
        try:
            if not _flock(gc):
                if self.on_wait:
                    self.on_wait()
                from kcache_cli.locking import wait_flock

                wait_flock(gc)
            self._empty_trash()  # what an interrupted run left behind
            batch = f"{os.getpid()}-{time.time_ns()}"
            os.mkdir(batch, 0o700, dir_fd=trash_fd)
            batch_fd = os.open(batch, _DIR_FLAGS, dir_fd=trash_fd)
            deleter = _Deleter(self.root / sd / "trash" / batch, self.warnings)
            try:
                for i, r in enumerate(self.plan.removals):
                    moved = self._remove(r, i, locks_fd, batch_fd)
                    if moved is not None:
                        deleter.put(moved, r.path)
                    if self.progress:
                        self.progress(r)
            finally:
                deleter.finish()
                os.close(batch_fd)
            self._empty_trash()
            removed_dirs = self._remove_empty_parents()
            if self.plan.tidy_state:
                self._tidy_state(locks_fd)
        finally:
            os.close(gc)
            self._close_all()
        freed = sum(r.size for r in self.removed)
        return DeleteResult(self.plan.root, tuple(self.removed), tuple(self.skipped), tuple(self.errors), freed,
                            tuple(removed_dirs), tuple(self.warnings))

    def _close_all(self) -> None:
        self._close_dirs()
        for fd in self.pinned.values():
            os.close(fd)
        self.pinned.clear()

    def _skip(self, r: Removal, why: str) -> None:
        self.skipped.append(Skip(r.entry, why))

    def _remove(self, r: Removal, i: int, locks_fd: int, batch_fd: int) -> str | None:
        """Rename one thing into the trash, holding its locks; the name in the trash, or None."""
        missing = [q for q in r.requires if q not in self.gone and os.path.lexists(self.root / q)]
        if missing:
            return self._skip(r, f"still used by {missing[0]}, which was not removed")
        head, _, name = r.relpath.rpartition("/")
        try:
            parent = self._dir_fd(head)
        except FileNotFoundError:
            return self._skip(r, "already gone")
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                return self._skip(r, "reached through a symlink: never followed out of the cache")
            return self._fail(r, exc)
        held: list[int] = []
        try:
            if r.lock is not None:
                # A kcache build creates its lock file before it compiles and touches an existing entry only
                # after compiling: with no lock file now, no build can replace this entry while we rename
                # it, so no lock file is created for it (removing 100,000 entries leaves no 100,000 locks).
                try:
                    fd = os.open(state.lock_path(self.root, r.lock).name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
                                 dir_fd=locks_fd)
                except FileNotFoundError:
                    fd = None
                if fd is not None:
                    held.append(fd)
                    if not _flock(fd):
                        return self._skip(r, "a kcache build holds its lock (in progress)")
            if r.what in (ENTRY, CANDIDATES):
                try:  # the entry's own directory (for candidates/: the parent already open)
                    efd = os.open(name, _DIR_FLAGS, dir_fd=parent) if r.what == ENTRY else os.dup(parent)
                except FileNotFoundError:
                    return self._skip(r, "already gone")
                except OSError as exc:
                    if exc.errno not in (errno.ELOOP, errno.ENOTDIR):  # a link since the scan: renamed as one
                        return self._fail(r, exc)
                    efd = None
                if efd is not None:
                    held.append(efd)
                    if r.what == ENTRY and os.fstat(efd).st_mtime > r.entry.modified:
                        return self._skip(r, "changed since the scan (in use, or rebuilt)")
                    for own in _layout(r.entry).writer_locks:
                        try:
                            fd = os.open(own, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=efd)
                        except OSError:
                            continue
                        held.append(fd)
                        if not _flock(fd):
                            return self._skip(r, f"{r.entry.layout} holds the entry's {own} (in use)")
                    now_status = _status_now(r.entry, self.root) if r.recheck else None
                    if now_status is not None and now_status not in BROKEN:
                        why = "finished" if now_status == COMPLETE else "changed"
                        return self._skip(r, f"{now_status} by now ({why} after the scan)")
            elif r.what in (TEMP, STAGING):
                if time.time() - measure_tree(r.path, lambda m: None).mtime < STALE_AFTER:
                    return self._skip(r, "in flight: written to less than an hour ago")
            moved = f"{i}-{name}"
            try:
                os.rename(name, moved, src_dir_fd=parent, dst_dir_fd=batch_fd)
            except FileNotFoundError:
                return self._skip(r, "already gone")
            except OSError as exc:
                if exc.errno != errno.EXDEV:
                    return self._fail(r, exc)
                # the trash is on another filesystem (a mount inside the cache): remove in place
                if not _delete_tree(r.path):
                    return self._fail(r, exc)
                moved = None
            self.removed.append(r)
            self.gone.add(r.relpath)
            if r.what == ENTRY:
                self._drop_stamp(r.relpath)
            return moved
        except OSError as exc:
            return self._fail(r, exc)
        finally:
            for fd in held:
                os.close(fd)

    def _fail(self, r: Removal, exc: OSError) -> None:
        self.errors.append((r.path, f"cannot remove {r.path}: {exc.strerror or exc}"))

    def _drop_stamp(self, relpath: str) -> None:
        if self.used_fd is not None:
            try:
                os.unlink(state._stamp_name(relpath), dir_fd=self.used_fd)
            except OSError:
                pass

    def _empty_trash(self) -> None:
        """Everything in the trash but a build's own (`build-*`, there for the instant a rebuilt entry
        replaces the old one) unless an hour old: holding the gc lock, no other prune or clear is running."""
        trash = self.root / state.STATE_DIR / "trash"
        now = time.time()
        for de in listdir(str(trash), lambda m: None):
            try:
                if de.name.startswith("build-") and now - de.stat(follow_symlinks=False).st_ctime < STALE_AFTER:
                    continue
            except OSError:
                continue
            if not _delete_tree(de.path):
                self.warnings.append(f"could not empty {de.path} (the next prune retries)")

    def _remove_empty_parents(self) -> list[str]:
        """hidet op and space directories, tilus script op directories, left empty by this run. A
        top-level directory (ops/, scripts/) stays: it is what tells the layout."""
        candidates: set[str] = set()
        for r in self.removed:
            if r.what not in (ENTRY, TEMP, LINK):
                continue
            rel = r.relpath
            for _ in range(_layout(r.entry).empty_parent_levels(r.entry.kind)):
                rel = rel.rpartition("/")[0]
                if "/" not in rel:
                    break
                candidates.add(rel)
        done: list[str] = []
        lock_names: list[str] | None = None
        for rel in sorted(candidates, key=lambda x: (-x.count("/"), x)):  # deepest first
            head, _, name = rel.rpartition("/")
            try:
                if os.listdir(self._dir_fd(rel)):
                    continue
            except OSError:
                continue
            # A kcache build takes its entry's lock before it makes the op directory and its temp dir in
            # it: holding every lock below this directory keeps a build from finding it gone in between.
            if lock_names is None:
                lock_names = sorted(os.listdir(self.pinned[f"{state.STATE_DIR}/locks"]))
            prefix = state._stamp_name(rel + "/")
            held: list[int] = []
            try:
                if not all(self._hold(n, held) for n in lock_names if n.startswith(prefix)):
                    continue
                fd = self.dir_fds.pop(rel, None)
                if fd is not None:
                    os.close(fd)
                os.rmdir(name, dir_fd=self._dir_fd(head))
            except OSError:
                continue  # not empty after all (or not ours to remove)
            finally:
                for fd in held:
                    os.close(fd)
            done.append(str(self.root / rel))
        return done

    def _hold(self, lock_name: str, held: list[int]) -> bool:
        try:
            fd = os.open(lock_name, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC,
                         dir_fd=self.pinned[f"{state.STATE_DIR}/locks"])
        except FileNotFoundError:
            return True
        held.append(fd)
        return _flock(fd)

    def _tidy_state(self, locks_fd: int) -> None:
        """Last-used stamps of entries that are gone; lock files of entries that are gone and that no
        one took for an hour (unlinked while we hold them)."""
        for rel in state.load_last_used(self.root):
            if not os.path.lexists(self.root / rel):
                self._drop_stamp(rel)
        now = time.time()
        for de in listdir(str(state.locks_dir(self.root)), lambda m: None):
            if not de.name.endswith(".lock") or de.name.startswith("."):
                continue
            rel = state._relpath_of_stamp(de.name[:-5])
            try:
                if now - de.stat(follow_symlinks=False).st_mtime < STALE_AFTER or os.path.lexists(self.root / rel):
                    continue
                fd = os.open(de.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=locks_fd)
            except OSError:
                continue
            try:
                if _flock(fd) and not os.path.lexists(self.root / rel):
                    os.unlink(de.name, dir_fd=locks_fd)
            except OSError:
                pass
            finally:
                os.close(fd)


class _Deleter:
    """Empties the trash in worker threads while the main thread renames entries into it. Deleting is
    waiting on the disk (unlinks, rmdirs), and disks serve several at once: 4 threads delete about
    twice as fast as one (and than `rm -rf`) on the disks measured; see bench/bench_prune.py."""

    THREADS = 4

    def __init__(self, batch: Path, warnings: list[str]):
        import queue
        import threading

        self.batch = batch
        self.warnings = warnings
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._run, name=f"kcache-trash-{i}", daemon=True)
                        for i in range(self.THREADS)]
        for t in self.threads:
            t.start()

    def put(self, name: str, origin: str) -> None:
        self.queue.put((name, origin))

    def finish(self) -> None:
        for _ in self.threads:
            self.queue.put(None)
        for t in self.threads:
            t.join()

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            name, origin = item
            if not _delete_tree(self.batch / name):
                self.warnings.append(f"could not delete all of {origin} (moved to the trash; the next prune "
                                     "retries)")


def _delete_tree(path) -> bool:
    """rm -rf of something in the trash: links are unlinked, never followed; a directory we cannot
    write to is made writable (it is ours, in the trash) and retried."""
    import shutil

    failed: list[str] = []

    def retry(func, p, exc) -> None:
        err = exc if isinstance(exc, BaseException) else exc[1]
        if isinstance(err, FileNotFoundError):
            return
        if isinstance(err, PermissionError):
            try:
                parent = os.path.dirname(p)
                os.chmod(parent, stat.S_IRWXU)
                if func in (os.rmdir, os.unlink) or getattr(func, "__name__", "") in ("rmdir", "unlink"):
                    func(p)
                    return
                if os.path.isdir(p) and not os.path.islink(p):
                    os.chmod(p, stat.S_IRWXU)
                    shutil.rmtree(p)
                    return
            except OSError:
                pass
        failed.append(p)

    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    if not stat.S_ISDIR(st.st_mode):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError:
            return False
        return True
    import sys

    if sys.version_info >= (3, 12):
        shutil.rmtree(path, onexc=retry)
    else:
        shutil.rmtree(path, onerror=retry)
    return not failed and not os.path.lexists(path)


def _status_now(e: Entry, root: Path | None = None) -> str:
    """The entry's status read again now, by the same deep judgement that selected it."""
    from kcache_cli.verify import judge_entry

    if root is None:
        root = Path(e.path[: len(e.path) - len(e.relpath)] or "/")
    return judge_entry(root, e, deep=True).status
