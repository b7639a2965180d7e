"""Deleting safely: selection -> a frozen `DeletePlan` (what goes, why, the bytes it
frees: that *is* the dry run) -> `DeletePlan.execute()`.

Executing a plan, for each removal: hold kcache's entry lock (`.kcache/locks/`, non-blocking: a build
in progress means skip) and the lock files the entry's own writer holds (Layout.writer_locks: hidet's
`.lock`), reach the parent directory from the
root without following a symlink, rename the entry into `.kcache/trash/` (same filesystem: a reader
sees the whole entry or nothing), then empty the trash. Symlinks are renamed and unlinked as links,
never followed. A later run empties trash that an interrupted run left behind."""

from __future__ import annotations

import contextlib
import errno
import os
import shlex
import signal
import stat
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Final, Iterable, Iterator, Mapping

from kcache_cli import layouts
from kcache_cli.catalog.scan import leftover_entries, narrowed_by_names, scan_cache
from kcache_cli.catalog.scan_context import ScanContext
from kcache_cli.fs import read as fsread
from kcache_cli.fs import state
from kcache_cli.fs import write as fswrite
from kcache_cli.fs.locking import NotALockFile, open_lock, try_flock, wait_flock
from kcache_cli.layouts import get
from kcache_cli.layouts.base import Layout
from kcache_cli.layouts.shapes import LayoutShape
from kcache_cli.model.records import (
    BUILDING,
    COMPLETE,
    PARTIAL,
    STALE,
    UNREADABLE,
    Entry,
    ScanFilter,
    ScanResult,
    Warn,
    disk_bytes,
    iso,
    measure_at,
    measure_tree,
    unmeasured,
)
from kcache_cli.model.terms import BROKEN, RemovalWhat  # BROKEN: what --broken removes (partial, failed, corrupt)
from kcache_cli.util import interrupts
from kcache_cli.util.errors import KcacheError, UsageError
from kcache_cli.util.lazy import lazy_module
from kcache_cli.util.progress import NO_PROGRESS, Progress

if TYPE_CHECKING:  # the real imports, for mypy; at run time each loads when a removal (or --broken) needs it
    import queue

    from kcache_cli.fs import delete as fsdelete
    from kcache_cli.ops import verify
else:  # a dry run shows the plan without them (3 ms of `clear --dry-run 7ebb`)
    queue = lazy_module("queue")
    fsdelete = lazy_module("kcache_cli.fs.delete")
    verify = lazy_module("kcache_cli.ops.verify")

ALREADY_GONE = "already gone"  # a Skip's why when another prune or clear removed the entry meanwhile
STALE_AFTER = 3600.0  # temp and staging directories untouched for an hour belong to no live writer
# What --broken removes (terms.BROKEN): never UNREADABLE (a permission problem is not damage), never STALE
# (another environment's compiler may still use it: --stale removes those).
# What a removal takes away.
ENTRY: Final = "entry"
CANDIDATES: Final = "candidates"
TEMP: Final = "temp"
STAGING: Final = "staging"
LINK: Final = "link"
LEFTOVER: Final = "leftover"  # a killed import's staging dir or export's temp file (kcache_cli.fs.state)
GC_LOCK = ".gc.lock"  # in .kcache/locks/: one prune or clear acts on a root at a time
# Beside it: rewritten (under the gc lock) by every prune or clear that removed something. A prune plans
# again under the lock when it changed since it planned: another one ran in between, waited for or not.
GC_GENERATION = ".gc.generation"



from kcache_cli.util.units import format_age, parse_age, parse_size  # noqa: E402,F401 - the one grammar (units.py)


# ---- the plan ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Removal:
    """One thing a plan removes: a whole entry, an entry's leftover candidates/, a stale temp or
    staging directory, or a symlink."""

    entry: Entry  # the entry as scanned (for candidates/: the entry that keeps living)
    path: str  # absolute path of what goes
    relpath: str
    size: int
    what: RemovalWhat  # ENTRY, CANDIDATES, TEMP, STAGING, LINK or LEFTOVER
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
    """What a removal did: entries removed and skipped, errors, bytes freed."""

    root: str
    removed: tuple[Removal, ...]
    skipped: tuple[Skip, ...]
    errors: tuple[tuple[str, str], ...]  # (path, message)
    freed: int
    removed_dirs: tuple[str, ...] = ()  # parent directories left empty and removed
    warnings: tuple[str, ...] = ()
    interrupted: bool = False  # stopped by SIGINT (SIGTERM, SIGHUP) between two removals (each one whole, or not begun)
    planned: DeletePlan | None = None  # the plan carried out, when it was made again after waiting (below)
    unreadable: tuple[str, ...] = ()  # the plan's: directories whose size is not known (DeletePlan.unreadable)
    trash: int = 0  # bytes emptied from the trash that interrupted runs left (not in freed: no entry's)

    @property
    def entries(self) -> int:
        return sum(1 for r in self.removed if r.what != CANDIDATES)

    def to_json(self, size_before: int, extra: Mapping[str, object] | None = None) -> dict:
        """`prune --json` / `clear --json` after removing: `size_before` is the plan's scanned size;
        `extra` the prune limits (max_size, older_than)."""
        return {"root": self.root, "exists": True, "dry_run": False, "removed": [r.to_json() for r in self.removed],
                "skipped": [s.to_json() for s in self.skipped], "errors": [m for _, m in self.errors],
                "entry_count": self.entries, "freed": self.freed, "size_before": size_before,
                "size_after": size_before - self.freed, **(extra or {}), "removed_dirs": list(self.removed_dirs),
                "warnings": list(self.warnings), "interrupted": self.interrupted, "unreadable": list(self.unreadable),
                "trash": self.trash}


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
    deep: bool = True  # broken entries are judged again at removal by reading every byte (False: as ls does)
    root_ident: tuple[int, int] | None = None  # (device, inode) of the root planned from: the executor's too
    # The same plan made again (a prune's): after waiting for another prune or clear, the executor makes
    # it again under the gc lock, and only what both plans remove goes (executor._planned_again).
    replan: Callable[[], DeletePlan] | None = field(default=None, compare=False, repr=False)
    generation: bytes = b""  # GC_GENERATION as it was when planning began
    # relpaths of the directories the scan could not list (records.unmeasured): never removed, and not in
    # scanned_size, so a prune to a size cannot tell whether the cache fits
    unreadable: tuple[str, ...] = ()
    # bytes an interrupted prune or clear left in .kcache/trash/ (trash_left): the run empties them first
    trash: int = 0

    @property
    def expected_freed_size(self) -> int:
        return sum(r.size for r in self.removals)

    @property
    def size_after(self) -> int:
        return self.scanned_size - self.expected_freed_size

    @property
    def entries(self) -> int:
        return sum(1 for r in self.removals if r.what != CANDIDATES)

    def to_json(self, extra: Mapping[str, object] | None = None, dry_run: bool = True) -> dict:
        """`prune --json` / `clear --json` of a dry run (or of a cache that does not exist, `dry_run` as
        asked); `extra` the prune limits (max_size, older_than)."""
        return {"root": self.root, "exists": self.exists, "dry_run": dry_run,
                "removed": [r.to_json() for r in self.removals], "skipped": [s.to_json() for s in self.skipped],
                "errors": [], "entry_count": self.entries, "freed": self.expected_freed_size,
                "size_before": self.scanned_size, "size_after": self.size_after, **(extra or {}),
                "warnings": list(self.warnings), "unreadable": list(self.unreadable), "trash": self.trash}

    def execute(self, progress: Callable[[Removal], None] | None = None,
                on_wait: Callable[[], None] | None = None, lock_timeout: float | None = None,
                interruptible: bool = False) -> DeleteResult:
        """Remove what the plan holds; waits at most `lock_timeout` seconds (None: for ever) for another
        prune or clear of the root (LockTimeout, exit 3, naming the holder). With `interruptible`, a
        SIGINT once removing has begun stops it after the removal under way (a second one raises
        KeyboardInterrupt): the result says `interrupted`, what went is whole gone, the rest untouched,
        and what is left in the trash the next prune or clear empties."""
        if not self.exists:
            return DeleteResult(self.root, (), self.skipped, (), 0, (), self.warnings, unreadable=self.unreadable)
        return _Executor(self, progress, on_wait, lock_timeout, interruptible).run()


# ---- selection -----------------------------------------------------------------------------------
def _layout_names() -> tuple[str, ...]:
    return tuple(layouts.NAMES)


def _layout(e: Entry):
    """The layout of `e` (kcache's own leftovers, "kcache" import/export temp files, have none)."""
    found = _LAYOUTS.get(e.layout)
    if found is None:
        if e.layout not in layouts.NAMES:
            return _NO_LAYOUT
        found = _LAYOUTS[e.layout] = layouts.get(e.layout)
    return found


_LAYOUTS: dict = {}  # layout name -> its layout: the registry asked once per name, not once per entry


def _provides(e: Entry) -> bool:
    """An entry others use (a tilus program, a tilelang binary): removed after its users, kept while a
    user stays (Layout.provider_kinds)."""
    return e.kind in _layout(e).provider_kinds


def _judged(root: Path, e: Entry) -> Entry:
    """`e` with the one deep judgement (verify's), which reads every byte: what ls's cheap checks call
    broken stays broken; what they call complete may not be."""
    if e.status in BROKEN:
        return e


    j = verify.judge_entry(root, e, deep=True)
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
        self._users_last: dict[int, float] = {}  # id of a list in _users -> its entries' newest last use
        self._dirs_ok: dict[str, str | None] = {}

    # -- relationships between entries (the layouts' dependency edges)
    def learn_users(self, providers: list[Entry]) -> None:
        """Learn which entries use each of `providers` (one pass per layout for all of them)."""
        todo: dict[str, list[str]] = {}
        for e in providers:
            if e.path not in self._users and _provides(e):
                todo.setdefault(e.layout, []).append(e.path)
        for layout, paths in todo.items():
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
        rel = self.rel(kept[0])
        where = get(e.layout).shape.locate(rel)
        more = f" and {len(kept) - 1} more" if len(kept) > 1 else ""
        return f"{_layout(e).use_words(e.kind)[1]} the kept {where[0] if where else 'entry'} {rel}{more}"

    def entry_at(self, path: str, layout: str) -> Entry:
        e = self.known.get(path)
        if e is None:
            for x in scan_cache(self.root, ScanFilter(layouts=(layout,))).entries:
                self.known.setdefault(x.path, x)
            e = self.known.get(path)
        if e is None:  # vanished since: a stand-in that still names it

            where = get(layout).shape.locate(self.rel(path))
            e = Entry(layout, where[0] if where else "entry", None, None, None, os.path.basename(path), path,
                      self.rel(path), 0, 0, PARTIAL, "vanished", 0.0, 0.0, 0)
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
                    bad = None if stat.S_ISDIR(fsread.stat_path(self.root / rel, follow=False).st_mode) else rel
                except OSError:
                    bad = rel
            self._dirs_ok[rel] = bad
        return self._dirs_ok[rel]

    def shape_problem(self, e: Entry, relpath: str | None = None) -> str | None:
        """Why `e` is left alone: it does not have the exact shape of an entry of its layout (positive
        evidence, checked by the layout itself); None when it does. With `relpath` (a temp or staging
        leftover) the path alone is judged."""
        names: frozenset[str] | None = None
        if relpath is None:
            try:
                names = frozenset(fsread.listdir(e.path))
            except OSError:
                names = None  # unreadable: judged by its path alone
        bad = _layout(e).shape_problem(relpath or e.relpath, e.kind, names, self.root)
        if bad is None:
            return None
        return f"left alone: not shaped like a {e.layout} {e.kind} entry ({bad})"

    # -- choosing
    def skip(self, e: Entry, why: str) -> None:
        self.skipped.setdefault(e.path, Skip(e, why))

    def select(self, e: Entry, why: str, recheck: bool = False, link: bool = False, sweep: bool = False
               ) -> list[Removal]:
        """Plan to remove `e` (or skip it, with the reason). Returns what was added. `sweep`: a leftover
        looked at because every prune clears them, not one asked for, whose fresh parts (a write in
        flight) are not candidates at all: kept without a word (cron mails nothing for a running build)."""
        if e.path in self.removals:
            return []
        via = self.link_in_path(e.relpath)
        if via is not None:
            if not any(r.what == LINK and (via == r.relpath or via.startswith(r.relpath + "/"))
                       for r in self.removals.values()):
                self.skip(e, f"reached through the symlink {via}: never followed out of the cache")
            return []
        if e.status == UNREADABLE and not link:  # a permission problem is not damage (docs/listing.md)
            self.skip(e, f"{e.reason or 'unreadable'}: never removed (fix its permissions first)")
            return []
        if e.status == BUILDING:  # the layout's own reason: a lock, or a writer's fresh files (Triton)
            self.skip(e, f"in progress: {e.reason}" if e.reason else "a build holds its lock (in progress)")
            return []
        if _is_leftover(e):
            return self._select_leftover(e, sweep)
        bad = None if link else self.shape_problem(e)
        if bad is not None:
            self.skip(e, bad)
            return []
        if link:
            r = Removal(e, e.path, e.relpath, e.size, LINK, why)
        else:
            r = Removal(e, e.path, e.relpath, e.size, ENTRY, why, lock=e.relpath, recheck=recheck)
        self.removals[e.path] = r
        self.skipped.pop(e.path, None)
        return [r]

    def _select_leftover(self, e: Entry, sweep: bool) -> list[Removal]:
        layout = _layout(e)
        added = []
        for x in layout.leftover_parts(e, self.warn):  # one per write (tilelang's .staging/cuda-binaries/)
            left = layout.leftover(x) or layout.leftover(e)
            assert left is not None, "a part of a leftover is a leftover"
            bad = self.shape_problem(x, relpath=x.relpath)
            if bad is not None:
                self.skip(x, bad)
                continue
            # kcache's own build temp dir follows its build's lock (free at the scan: its build is gone);
            # others are in flight for an hour after their last write
            if left.lock is None and self.now - x.modified < STALE_AFTER:
                if not sweep:
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
        a complete provider still used by an entry that stays, stays (tilus programs, tilelang binaries).
        The users of every provider selected are learnt at once first: one walk of tilus's scripts/, not
        one for each broken program (20,000 of them: a stats of 3.7 s)."""
        self.learn_users([r.entry for r in self.removals.values() if r.what == ENTRY])
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
        through its kernels) was last used when they were. Providers may share one list of users (copies
        of one tilelang binary): its newest use is found once (the lists live as long as the planner)."""
        deps = self.dependants(e)
        if not deps:
            return e.last_used
        newest = self._users_last.get(id(deps))
        if newest is None:
            newest = self._users_last[id(deps)] = max(
                (o.last_used for o in map(by_path.get, deps) if o is not None), default=float("-inf"))
        return max(e.last_used, newest)

    def plan(self, result: ScanResult, warnings: Iterable[str], tidy: bool = False) -> DeletePlan:
        """The plan of what was selected in `result`, the scan it was selected from; what the trash holds of
        interrupted runs when the plan runs at all (a prune's always, `tidy`; a clear's when it removes)."""
        order = sorted(self.removals.values(), key=lambda r: _provides(r.entry))  # users first
        return DeletePlan(str(self.root), True, tuple(order), tuple(self.skipped.values()), result.size,
                          tuple(warnings), tidy, root_ident=_root_ident(self.root),
                          unreadable=_unmeasured(result), trash=trash_left(self.root) if order or tidy else 0)



def _unmeasured(result: ScanResult) -> tuple[str, ...]:
    """The directories whose size the scan could not know: the root itself ("."), when it could not be
    listed, and those inside it."""
    inside = tuple(e.relpath for e in result.entries if unmeasured(e))
    return (".", *inside) if result.unlisted else inside


def _root_ident(root: Path) -> tuple[int, int] | None:
    """(device, inode) of the root as held (fsread.hold_root), else as its path names it now."""
    try:
        fd = fswrite.open_root(root)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    return st.st_dev, st.st_ino


def _strays(root: Path, flt: ScanFilter, warn: Warn, layouts: Iterable[str]) -> list[Entry]:

    ctx = ScanContext(Path(root), warn, {})
    out: list[Entry] = []
    for name in layouts:
        if not flt.layouts or name in flt.layouts:
            out.extend(e for e in get(name).stray_links(ctx, flt) if flt.matches(e))
    return out


def _collector(warn: Warn | None) -> tuple[list[str], Warn]:
    """(the plan's warnings, the function that collects them): each said once, however many of the plan's
    passes (the scan, the deep judging, the links where entries belong) meet the same unreadable directory."""
    msgs: list[str] = []
    seen: set[str] = set()

    def collect(m: str) -> None:
        if m in seen:
            return
        seen.add(m)
        msgs.append(m)
        if warn is not None:
            warn(m)

    return msgs, collect


def plan_clear(root: Path, flt: ScanFilter, everything: bool = False, warn: Warn | None = None,
               now: float | None = None, progress: Progress = NO_PROGRESS, use_index: bool = False) -> DeletePlan:
    """Remove the entries `flt` selects (everything with `everything`), within the rules: skip builds in
    progress, keep tilus programs and tilelang binaries that kept entries use. `use_index`: unchanged
    entries answered from the index (plan_prune; entries named by hash prefix or path never are: scan_cache)."""
    if not everything and flt == ScanFilter():
        raise UsageError("clear needs a selection: --space, --op, --target, --layout, hash prefixes, or --all")
    root = Path(root)
    msgs, collect = _collector(warn)
    # Entries named by hash or path: only the layouts and spaces whose directory names show them are
    # judged (the same entries match); symlinks where entries belong are looked for everywhere.
    result = scan_cache(root, narrowed_by_names(root, flt) if flt.name_prefixes() else flt, collect,
                        progress=progress, use_index=use_index)
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
    return p.plan(result, msgs)


def plan_prune(root: Path, max_size: int | None = None, older_than: float | None = None, broken: bool = False,
               warn: Warn | None = None, now: float | None = None, stale: bool = False, deep: bool = True,
               progress: Progress = NO_PROGRESS, judging: Progress = NO_PROGRESS,
               scanned: ScanResult | None = None, use_index: bool = False) -> DeletePlan:
    """What is safe and useful to remove: always stale temp/staging directories and the leftovers the
    layouts name inside entries; with `broken`, partial, failed and corrupt entries (`deep`: judged by
    reading every byte, as verify does, `judging` counting the entries read; else as ls judges them,
    from names, sizes and headers); with `stale`,
    entries of a compiler version the loader never looks up again;
    with `older_than` (seconds), entries unused for that long; with `max_size` (bytes), least recently
    used entries until the cache fits. `scanned`: the whole root's scan already made (stats' own), not
    made again; else one is made, `use_index` answering unchanged entries from the index (as ls does: the
    same entries, statuses and last uses, kcache_cli/catalog/index.py)."""
    root = Path(root)
    generation = gc_generation(root)  # before the scan: a prune or clear from here on makes it plan again
    now = time.time() if now is None else now
    msgs, collect = _collector(warn)
    if scanned is None:
        result = scan_cache(root, ScanFilter(), collect, progress=progress, use_index=use_index)
    else:  # kcache's own leftovers are looked for below (_select_kcache_leftovers), not taken from it
        names = _layout_names()
        result = replace(scanned, entries=tuple(e for e in scanned.entries if e.layout in names))
        msgs.extend(scanned.warnings)  # said when it was made
    if not result.exists:
        return DeletePlan(str(root), False, warnings=tuple(msgs))
    entries = tuple(e for e in result.entries if not _unlisted(e))
    by_path = {e.path: e for e in entries}
    p = _Planner(root, collect, now, by_path)
    leftovers = [e for e in entries if _is_leftover(e)]
    regular = [e for e in entries if not _is_leftover(e)] if leftovers else list(entries)
    for e in leftovers:  # 1. always: what interrupted writers left behind (not a write in flight: no news,
        if e.status != BUILDING:  # but --broken says why it keeps one that ls calls broken)
            p.select(e, "stale", sweep=not (broken and e.status in BROKEN))
    _select_kcache_leftovers(p, root, collect)
    if broken:  # 2. broken entries (and symlinks where entries belong)
        _select_broken(p, root, regular, collect, result.layouts, judging if deep else None)
    if stale:
        for e in regular:
            if e.status == STALE and e.path not in p.removals:
                p.select(e, f"stale: {e.reason or e.status}", recheck=True)
    last: dict[str, float] = {}
    # a cache within its budget loses nothing to it (stats' RECLAIMABLE asks neither, a cron job's prune mostly)
    over = max_size if max_size is not None and result.size > max_size else None
    if older_than is not None or over is not None:
        p.learn_users(regular)  # 3. unused for too long (a provider is used when its users are)
        last = {e.path: p.effective_last_used(e, by_path) for e in regular}
    if older_than is not None:
        for e in regular:
            if now - last[e.path] > older_than and e.path not in p.removals:
                p.select(e, f"unused for {format_age(now - last[e.path])}")
    p.settle()
    inner = _select_inner_leftovers(p, regular, collect)  # 4. leftovers inside entries that stay
    if over is not None:  # 5. least recently used first, until the cache fits
        _select_until_fits(p, regular, last, inner, result.size, over)
    again = partial(plan_prune, root, max_size=max_size, older_than=older_than, broken=broken, stale=stale, deep=deep,
                    use_index=use_index)
    return replace(p.plan(result, msgs, tidy=True), deep=deep, replan=again, generation=generation)


def gc_generation(root: Path, locks_fd: int | None = None) -> bytes:
    """GC_GENERATION's bytes (b"": none yet, or unreadable), from the locks directory held as `locks_fd`
    or by path, read without following a link (fsread: a regular file only)."""
    name = GC_GENERATION if locks_fd is not None else str(state.locks_dir(root) / GC_GENERATION)
    try:
        return fsread.read_bytes(name, 64, dir_fd=locks_fd, strict=False)
    except OSError:
        return b""


def _select_broken(p: _Planner, root: Path, regular: list[Entry], warn: Warn, layouts: Iterable[str],
                   deep: Progress | None) -> None:
    """Symlinks where entries belong, and entries broken by the scan's cheap judgement (what ls shows)
    or, with `deep` (which counts the entries read), by the one that reads every byte."""
    for s in _strays(root, ScanFilter(), warn, layouts):
        p.select(s, "a symlink where an entry belongs: removed as a link", link=True)
    if deep is not None:
        deep.start(len(regular))
    for e in regular:
        if deep is not None:
            e = _judged(root, e)
            deep.advance(1)
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
            if os.path.islink(path) or not os.path.exists(path) or p.link_in_path(f"{e.relpath}/{left.name}"):
                continue
            if p.shape_problem(e) is not None:
                continue
            if e.status == BUILDING:
                p.skip(e, left.busy)
                continue
            size = measure_tree(path, warn).size if os.path.isdir(path) else disk_bytes(os.lstat(path))
            r = Removal(e, path, f"{e.relpath}/{left.name}", size, left.what, left.why, lock=e.relpath)
            p.removals[path] = r
            out.setdefault(e.path, []).append(r)
    return out


def _newest(path: str) -> float:
    """The newest mtime in a leftover: a directory's tree, or a file (numba's temp file) itself."""
    return measure_tree(path, lambda m: None).mtime if os.path.isdir(path) else os.lstat(path).st_mtime


def _select_until_fits(p: _Planner, regular: list[Entry], last: dict[str, float], inner: dict[str, list[Removal]],
                       size: int, max_size: int) -> None:
    """Least recently used entries (users before the providers they use) until `size` fits `max_size`."""
    remaining = size - sum(r.size for r in p.removals.values())
    # Of entries last used at the same time (a copied or untarred cache shares one mtime) the larger go
    # first: one 7 MB entry rather than twenty small ones; the loop stops as soon as the cache fits.
    for e in sorted(regular, key=lambda e: (last[e.path], _provides(e), -e.size, e.relpath)):
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


def _select_kcache_leftovers(p: _Planner, root: Path, warn: Warn) -> None:
    """What killed imports and exports left in the root, once their writer is gone."""
    for e in leftover_entries(root, warn):
        if e.status == BUILDING:
            p.skip(e, f"a running {e.kind} holds it")
        else:
            why = "staging of an interrupted import" if e.kind == "import" else "temp file of an interrupted export"
            p.removals[e.path] = Removal(e, e.path, e.relpath, e.size, LEFTOVER, why)


def trash_left(root: Path, now: float | None = None) -> int:
    """The bytes in `root`'s .kcache/trash/ that the next prune or clear empties before anything else: what
    an interrupted one left (killed between moving entries there and removing them), not a build's own
    (`build-*`, there for an instant) unless an hour old. Read as the executor empties it (_empty_trash):
    from the root held open, never through a link; 0 when there is no trash."""
    try:
        root_fd = fswrite.open_root(root)
    except OSError:
        return 0
    fds = [root_fd]
    try:
        fds.append(fswrite.open_dir(root_fd, state.STATE_DIR))  # one name each, no link followed
        fds.append(fswrite.open_dir(fds[-1], "trash"))
        now = time.time() if now is None else now
        return sum(_trash_item(fds[-1], name, now)[0] for name in os.listdir(fds[-1]))
    except OSError:
        return 0
    finally:
        for fd in fds:
            os.close(fd)


def _trash_item(trash_fd: int, name: str, now: float, measure: bool = True) -> tuple[int, bool]:
    """(the bytes on disk of `name` in the trash, 0 unless `measure`; whether the trash is emptied of it now:
    not a build's own (`build-*`) younger than an hour). A directory is walked from the trash's fd,
    following no link."""
    try:
        st = os.stat(name, dir_fd=trash_fd, follow_symlinks=False)
    except OSError:
        return 0, False
    if name.startswith("build-") and now - st.st_ctime < STALE_AFTER:
        return 0, False
    if not measure:
        return 0, True
    return measure_at(trash_fd, name, lambda m: None).size, True




# ---- acting --------------------------------------------------------------------------------------
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)  # a full disk: delete in place instead of through the trash
_LINKED = (errno.ELOOP, errno.ENOTDIR)


REPLACED = "replaced since the scan (another directory or link there now): left alone"


def _scanned(r: Removal) -> tuple[int, int] | None:
    """The identity the scan saw of what `r` removes (None: not known, or `r` removes a part of its entry)."""
    if not r.entry.ino or r.path != r.entry.path:
        return None
    return r.entry.dev, r.entry.ino


def _read_only(root: Path) -> bool:
    """Whether `root` lies on a read-only mount (nothing in it can be written, .kcache/ included)."""
    try:
        return bool(os.statvfs(root).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _flock(fd: int) -> bool:
    return try_flock(fd)


class _Executor:
    def __init__(self, plan: DeletePlan, progress, on_wait, lock_timeout: float | None = None,
                 interruptible: bool = False):
        self.plan = plan
        self.interruptible = interruptible
        self.stopped = False  # a SIGINT asked to stop
        self.trash_freed = 0  # bytes emptied from the trash interrupted runs left (_empty_trash)
        self.lock_timeout = lock_timeout
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
        self.locks_fd: int | None = None
        self.mounts: list[str] = []  # mount points inside the root: never crossed
        self._ident: tuple[int, int] | None = None
        self.waited = False  # for the gc lock: another prune or clear held it
        self.replanned: DeletePlan | None = None  # the plan made again after waiting (_planned_again)

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
        made = create and fswrite.mkdir_at(parent, name, 0o777, exist_ok=True)
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent)
        rst = os.fstat(self.pinned[""])
        why = None if state.trusted_root(self.root) else \
            state.state_problem(os.fstat(fd), rst, str(self.root / relpath), self.root)
        if why:  # another user's .kcache/, locks/ or trash/: its lock and trash are not kcache's to use
            os.close(fd)
            raise KcacheError(f"{why}; nothing was removed")
        self.pinned[relpath] = fd
        if create and fswrite.group_shared(rst):
            # in a group-shared cache every member takes locks and uses the trash, whatever the umask
            # of whoever made them (root's cron with 022 included); elsewhere the umask decides
            fswrite.share_with_group(fd, rst.st_gid)
        fswrite.give_back_state(fd, rst)  # root's in a user's cache (made now or by an earlier run): the user's
        if made and relpath == state.STATE_DIR:
            state.write_gitignore(fd)
        return fd

    def _refuse(self, relpath: str, exc: OSError) -> KcacheError:
        if exc.errno in _LINKED:
            return KcacheError(f"{self.root / relpath} is a symlink or not a directory: kcache never writes "
                               "through a link; nothing was removed")
        return KcacheError(f"cannot write to {self.root / relpath}: {exc.strerror or exc}; nothing was removed"
                           + _permission_fix(self.root / relpath, exc, self.root,
                                             os.fstat(self.pinned[""]) if "" in self.pinned else None))

    def _lock_gc(self) -> int:
        """Pin .kcache/ and .kcache/locks/ and take the gc lock (saying so while it waits). On a full disk
        where they cannot be created, the lock is taken on the deepest directory that exists."""
        sd = state.STATE_DIR
        gc = None
        try:
            self._pin(sd, create=True)
            self.locks_fd = self._pin(f"{sd}/locks", create=True)
            gc = open_lock(GC_LOCK, self.locks_fd, create=True)
        except NotALockFile:
            raise KcacheError(f"{self.root / sd / 'locks' / GC_LOCK} is not a regular file (planted there?): "
                              "remove it to prune or clear this cache; nothing was removed") from None
        except OSError as exc:
            if exc.errno not in _NO_SPACE:
                raise self._refuse(f"{sd}/locks" if sd in self.pinned else sd, exc) from None
            self.warnings.append(f"no space left in {self.root}: removing in place, without the trash")
            gc = os.dup(self.pinned.get(f"{sd}/locks", self.pinned.get(sd, self.pinned[""])))
        if not _flock(gc):
            self.waited = True
            if self.on_wait:
                self.on_wait()

            try:
                wait_flock(gc, self.lock_timeout, f"the gc lock of {self.root} (another prune or clear)")
            except BaseException:
                os.close(gc)
                raise
        return gc

    def _check_pins(self) -> None:
        """After waiting for the gc lock: .kcache/ and its locks/ must still be the directories pinned
        (one swapped for a link meanwhile is refused, never followed)."""
        for rel, fd in list(self.pinned.items()):
            if not rel:
                continue
            parent = self.pinned[rel.rpartition("/")[0]]
            try:
                now = os.open(rel.rpartition("/")[2], _DIR_FLAGS, dir_fd=parent)
            except OSError as exc:
                raise self._refuse(rel, exc) from None
            try:
                a, b = os.fstat(now), os.fstat(fd)
            finally:
                os.close(now)
            if (a.st_dev, a.st_ino) != (b.st_dev, b.st_ino):
                raise KcacheError(f"{self.root / rel} was replaced while waiting for the gc lock; nothing was removed")

    def _same_root(self) -> None:
        """The root opened to act must be the directory the plan was made from (its path swapped for a
        link or another directory since: nothing is removed)."""
        st = os.fstat(self.pinned[""])
        if self.plan.root_ident is not None and (st.st_dev, st.st_ino) != self.plan.root_ident:
            raise KcacheError(f"{self.root} is not the directory that was scanned any more (replaced, or "
                              "a link?); nothing was removed")

    def _trash(self) -> int | None:
        """Pin .kcache/trash/, empty what earlier runs left, and make this run's batch in it; None when the
        disk is full (removals then happen in place)."""
        sd = state.STATE_DIR
        if f"{sd}/locks" not in self.pinned:
            return None
        try:
            trash_fd = self._pin(f"{sd}/trash", create=True)
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                self.warnings.append(f"no space left in {self.root}: removing in place, without the trash")
                return None
            raise self._refuse(f"{sd}/trash", exc) from None
        self._empty_trash(left=True)  # what an interrupted run left behind
        batch = f"{os.getpid()}-{time.time_ns()}"
        try:
            fswrite.mkdir_at(trash_fd, batch, 0o700)
        except OSError as exc:
            if exc.errno in _NO_SPACE:
                self.warnings.append(f"no space left in {self.root}: removing in place, without the trash")
                return None
            raise self._refuse(f"{sd}/trash/{batch}", exc) from None
        fd = os.open(batch, _DIR_FLAGS, dir_fd=trash_fd)
        fswrite.share_like_dir(fd, trash_fd)  # a batch an interrupted run leaves, the next member empties
        return fd

    def run(self) -> DeleteResult:
        sd = state.STATE_DIR
        if not self.plan.removals and (not os.path.isdir(self.root / sd) or _read_only(self.root)):
            # nothing to remove, and no trash or lock of an earlier run this one could empty or tidy
            return DeleteResult(self.plan.root, (), tuple(self.skipped), (), 0, (), tuple(self.warnings),
                                unreadable=self.plan.unreadable)

        self.mounts = fsdelete.mount_points_under(os.path.realpath(self.root))
        try:
            self.pinned[""] = fswrite.open_root(self.root)
            self._same_root()
            gc = self._lock_gc()
        except OSError as exc:
            self._close_all()
            raise KcacheError(f"cannot open {self.root}: {exc.strerror or exc}; nothing was removed") from None
        except KcacheError:
            self._close_all()
            raise
        removed_dirs: list[str] = []
        try:
            self._check_pins()
            moved_on = self.locks_fd is not None and gc_generation(self.root, self.locks_fd) != self.plan.generation
            if (self.waited or moved_on) and self.plan.replan is not None:
                self._planned_again(self.plan.replan)
            self._share_state()
            try:
                self.used_fd = self._pin(f"{sd}/used", create=False) if sd in self.pinned else None
            except OSError:
                self.used_fd = None
            # a SIGINT from here on sets `stopped` (checked between removals, while the trash threads
            # finish and between trash batches): it never escapes half-way with the result lost
            with self._sigint_stops():
                batch_fd = self._trash()
                self._remove_all(batch_fd)
                if batch_fd is not None and not self.stopped:
                    self._empty_trash()
                removed_dirs = self._remove_empty_parents()
                if self.plan.tidy_state and self.locks_fd is not None and not self.stopped:
                    self._tidy_state(self.locks_fd)
                if self.removed and self.locks_fd is not None:
                    self._next_generation(self.locks_fd)
        finally:
            os.close(gc)
            self._close_all()
        freed = sum(r.size for r in self.removed)
        return DeleteResult(self.plan.root, tuple(self.removed), tuple(self.skipped), tuple(self.errors), freed,
                            tuple(removed_dirs), tuple(self.warnings), self.stopped, self.replanned,
                            self.plan.unreadable, self.trash_freed)

    def _next_generation(self, locks_fd: int) -> None:
        """GC_GENERATION rewritten: a prune that planned before this one removed anything plans again."""
        try:
            fswrite.replace_file_shared(locks_fd, GC_GENERATION, f"{time.time_ns()}-{os.getpid()}\n".encode())
        except OSError:
            pass

    def _share_state(self) -> None:
        """In a group-shared cache, the rest of .kcache/ this user made (last-used stamps, the index) made
        the group's too, as _pin does for locks/ and trash/: a member's build hit must be able to stamp. Run
        as root in a user's cache, what an earlier root run left root's there is the user's again."""
        sd, root_st = state.STATE_DIR, os.fstat(self.pinned[""])
        shared = fswrite.group_shared(root_st)
        if sd not in self.pinned or not shared and fswrite.owner_for(root_st) is None:
            return
        for sub in ("used", state.INDEX_DIR) + (() if shared else ("trash",)):
            try:
                fd = os.open(sub, _DIR_FLAGS, dir_fd=self.pinned[sd])
            except OSError:
                continue
            try:
                if shared:
                    fswrite.share_with_group(fd, root_st.st_gid)  # only what this user owns
                else:  # root in a user's cache: what an earlier root run left root's goes back to the user
                    fswrite.give_back_state(fd, root_st)
            except OSError:
                pass
            finally:
                os.close(fd)

    def _planned_again(self, replan: Callable[[], DeletePlan]) -> None:
        """After waiting for another prune or clear, which may have removed entries or brought the cache
        under its budget: the plan made again under the gc lock; of it only what was planned (and
        confirmed) before goes. The new plan's sizes are the ones reported."""
        fresh = replan()
        before = {r.path for r in self.plan.removals}
        kept = tuple(r for r in fresh.removals if r.path in before)
        if len(kept) < len(before):
            self.warnings.append(f"another prune or clear ran since this one planned: planned again under the "
                                 f"gc lock, {len(before) - len(kept):,} of the {len(before):,} removals planned are "
                                 "no longer needed")
        self.skipped = list(fresh.skipped)
        self.plan = self.replanned = replace(fresh, removals=kept, warnings=self.plan.warnings, replan=None)

    def _remove_all(self, batch_fd: int | None) -> None:
        """Every removal of the plan in turn (renamed into the batch, emptied by the deleter's threads),
        until a SIGINT asks to stop: then what is queued stays in the trash, whole gone from the cache."""
        deleter = _Deleter(batch_fd, f"{state.STATE_DIR}/trash", self.errors) if batch_fd is not None else None
        try:
            for i, r in enumerate(self.plan.removals):
                if self.stopped:
                    break
                moved = self._remove(r, i, batch_fd)
                if moved is not None and deleter is not None:
                    deleter.put(moved, r.path)
                if self.progress:
                    self.progress(r)
        finally:
            if deleter is not None:
                deleter.finish(abandon=self.stopped, stop=lambda: self.stopped)
            if batch_fd is not None:
                os.close(batch_fd)

    @contextlib.contextmanager
    def _sigint_stops(self) -> Iterator[None]:
        """With `interruptible` (in the main thread): the first SIGINT, SIGTERM or SIGHUP (cron's timeout,
        systemd, docker stop) sets `stopped` (checked between removals), a second raises KeyboardInterrupt."""
        if not self.interruptible or threading.current_thread() is not threading.main_thread():
            yield
            return
        stopping = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

        def stop(signum, _frame) -> None:
            self.stopped = True
            interrupts.took(signum)  # the command's exit status: 128 + it
            for sig in stopping:
                signal.signal(sig, signal.default_int_handler)

        old = {sig: signal.signal(sig, stop) for sig in stopping}
        try:
            yield
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)

    def _close_all(self) -> None:
        self._close_dirs()
        for fd in self.pinned.values():
            os.close(fd)
        self.pinned.clear()

    def _skip(self, r: Removal, why: str) -> None:
        self.skipped.append(Skip(r.entry, why))

    def _mount_inside(self, r: Removal) -> str | None:
        if not self.mounts:
            return None
        real = os.path.join(os.path.realpath(self.root), r.relpath)
        return next((m for m in self.mounts if m == real or m.startswith(real + "/")), None)

    def _remove(self, r: Removal, i: int, batch_fd: int | None) -> str | None:
        """Rename one thing into the trash (or remove it in place), holding its locks; the name in the
        trash, or None."""
        missing = [q for q in r.requires if q not in self.gone and os.path.lexists(self.root / q)]
        if missing:
            return self._skip(r, f"still used by {missing[0]}, which was not removed")
        mount = self._mount_inside(r)
        if mount is not None:
            return self._skip(r, f"holds the mount point {mount}: never crossed")
        head, _, name = r.relpath.rpartition("/")
        try:
            parent = self._dir_fd(head)
        except FileNotFoundError:
            return self._skip(r, ALREADY_GONE)
        except OSError as exc:
            if exc.errno in _LINKED:
                return self._skip(r, "reached through a symlink: never followed out of the cache")
            return self._fail(r, exc)
        if r.what == LEFTOVER:
            return self._remove_leftover(r, parent, name)
        held: list[int] = []
        self._ident = None  # what is renamed must be what was locked and checked
        try:
            why = self._hold_locks(r, parent, name, held)
            if why is None and r.what == ENTRY:
                why = _layout(r.entry).in_use(r.entry)
            if why is not None:
                return self._skip(r, why)
            return self._move(r, i, parent, name, batch_fd)
        except OSError as exc:
            return self._fail(r, exc)
        finally:
            for fd in held:
                os.close(fd)

    def _hold_locks(self, r: Removal, parent: int, name: str, held: list[int]) -> str | None:
        """Take the removal's locks (kept in `held`); the reason to keep it instead, or None."""
        followed = r.lock is not None and self.locks_fd is not None  # its writer's lock: free, or never made
        if r.lock is not None and self.locks_fd is not None:
            # A kcache build creates its lock file before it compiles and touches an existing entry only
            # after compiling: with no lock file now, no build can replace this entry while we rename
            # it, so no lock file is created for it (removing 100,000 entries leaves no 100,000 locks).
            # Likewise it makes its temp dir only once it holds the lock: a temp dir whose lock is free
            # (held here now) or missing is no build's.
            try:
                fd = open_lock(state.lock_path(self.root, r.lock).name, self.locks_fd)
            except (FileNotFoundError, NotALockFile):  # a FIFO planted there is no lock (and never read)
                fd = None
            if fd is not None:
                held.append(fd)
                if not _flock(fd):
                    return "a kcache build holds its lock (in progress)"
        if r.what in (ENTRY, CANDIDATES):
            try:  # the entry's own directory (for candidates/: the parent already open)
                efd = os.open(name, _DIR_FLAGS, dir_fd=parent) if r.what == ENTRY else os.dup(parent)
            except FileNotFoundError:
                return ALREADY_GONE
            except OSError as exc:
                if exc.errno not in _LINKED:  # a link since the scan: renamed as one
                    raise
                efd = None
            if efd is not None:
                held.append(efd)
                est = os.fstat(efd)
                self._ident = (est.st_dev, est.st_ino)
                if _scanned(r) not in (None, self._ident):
                    return REPLACED
                if r.what == ENTRY and est.st_mtime > r.entry.modified:
                    return "changed since the scan (in use, or rebuilt)"
                for own in _layout(r.entry).writer_locks:
                    try:
                        fd = open_lock(own, efd)
                    except OSError:  # missing, or a FIFO or device: not a lock the writer holds
                        continue
                    held.append(fd)
                    if not _flock(fd):
                        return f"{r.entry.layout} holds the entry's {own} (in use)"
                now_status = _status_now(r.entry, self.root, self.plan.deep) if r.recheck else None
                if now_status is not None and now_status not in (*BROKEN, STALE):
                    why = "finished" if now_status == COMPLETE else "changed"
                    return f"{now_status} by now ({why} after the scan)"
        elif r.what in (TEMP, STAGING) and not followed:
            if time.time() - _newest(r.path) < STALE_AFTER:
                return "in flight: written to less than an hour ago"
        return None

    def _move(self, r: Removal, i: int, parent: int, name: str, batch_fd: int | None) -> str | None:
        """Rename into the batch; in place when there is no trash, the trash is on another filesystem
        (the entry sits on a mount inside the cache) or the disk is too full to rename."""
        moved = f"{i}-{name}"
        try:
            before = os.stat(name, dir_fd=parent, follow_symlinks=False)
            if r.what == LINK and not stat.S_ISLNK(before.st_mode):
                return self._skip(r, "no longer a symlink (replaced since the scan)")
            if r.what == ENTRY and self._ident not in (None, (before.st_dev, before.st_ino)):
                return self._skip(r, "replaced since it was locked")
            if _scanned(r) not in (None, (before.st_dev, before.st_ino)):
                return self._skip(r, REPLACED)
            if batch_fd is None:
                raise OSError(errno.ENOSPC, "no trash")
            fswrite.rename_at(parent, name, batch_fd, moved)
            after = os.stat(moved, dir_fd=batch_fd, follow_symlinks=False)
            if (after.st_dev, after.st_ino) != (before.st_dev, before.st_ino):  # swapped in between: put back
                fswrite.rename_noreplace_at(batch_fd, moved, parent, name)
                return self._skip(r, "replaced while being removed")
        except FileNotFoundError:
            return self._skip(r, ALREADY_GONE)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, *_NO_SPACE):
                return self._fail(r, exc)
            done = fsdelete.remove_tree(parent, name, label=r.relpath)
            if not done.gone:
                return self._fail_text(r, "; ".join(done.problems[:3]))
            moved = ""
        self.removed.append(r)
        self.gone.add(r.relpath)
        if r.what == ENTRY:
            self._drop_stamp(r.relpath)
        return moved or None

    def _remove_leftover(self, r: Removal, parent: int, name: str) -> None:
        """An import's staging dir or an export's temp file: removed while this run holds the flock its
        writer would hold, and only if its writer is gone."""
        is_dir = r.entry.kind == "import"
        flags = (os.O_RDONLY | os.O_DIRECTORY if is_dir else os.O_RDONLY | os.O_NONBLOCK) | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            fd = os.open(name, flags, dir_fd=parent)
        except FileNotFoundError:
            return self._skip(r, ALREADY_GONE)
        except OSError as exc:
            return self._fail(r, exc)
        try:
            st = os.fstat(fd)
            if _scanned(r) not in (None, (st.st_dev, st.st_ino)):
                return self._skip(r, REPLACED)
            if not _flock(fd):
                return self._skip(r, f"a running {r.entry.kind} holds it")
            live = state.leftover_live_held(name, st)
            if live:
                return self._skip(r, live)
            if is_dir:
                done = fsdelete.remove_tree(parent, name, label=r.relpath)
                if not done.gone:
                    return self._fail_text(r, "; ".join(done.problems[:3]))
            else:
                fswrite.unlink_at(parent, name, missing_ok=False)
        except OSError as exc:
            return self._fail(r, exc)
        finally:
            os.close(fd)
        self.removed.append(r)
        self.gone.add(r.relpath)
        return None

    def _fail(self, r: Removal, exc: OSError) -> None:
        # a member's entry in a shared cache, say; root is refused by other means (an immutable flag)
        denied = exc.errno in (errno.EACCES, errno.EPERM) and os.geteuid() != 0
        self._fail_text(r, (exc.strerror or str(exc)) + (" (its owner or root may remove it)" if denied else ""))

    def _fail_text(self, r: Removal, why: str) -> None:
        self.errors.append((r.path, f"cannot remove {r.path}: {why}"))

    def _drop_stamp(self, relpath: str) -> None:
        if self.used_fd is not None:
            try:
                fswrite.unlink_at(self.used_fd, state.stamp_name(relpath))
            except OSError:
                pass

    def _empty_trash(self, left: bool = False) -> None:
        """Everything in the trash but a build's own (`build-*`, there for the instant a rebuilt entry
        replaces the old one) unless an hour old: holding the gc lock, no other prune or clear is running.
        Through the pinned trash descriptor only: a `trash` swapped for a link is never followed. `left`:
        what is there was left by interrupted runs (not this one's batch): its bytes are counted (trash_freed)."""
        trash = f"{state.STATE_DIR}/trash"
        fd = self.pinned[trash]
        now = time.time()
        try:
            names = sorted(os.listdir(fd))
        except OSError as exc:
            self.errors.append((str(self.root / trash), f"cannot read {self.root / trash}: {exc.strerror}"))
            return
        for name in names:
            if self.stopped:  # Ctrl-C: the rest of the trash waits for the next prune
                break
            size, due = _trash_item(fd, name, now, measure=left)
            if not due:
                continue
            done = fsdelete.remove_tree(fd, name, label=f"{trash}/{name}")
            if done.gone:
                self.trash_freed += size
            else:
                path = str(self.root / trash / name)
                self.errors.append((path, f"could not empty {path} (the next prune retries): "
                                          + "; ".join(done.problems[:3])))

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
                lock_names = sorted(os.listdir(self.locks_fd)) if self.locks_fd is not None else []
            prefix = state.stamp_name(rel + "/")
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
            fd = open_lock(lock_name, self.locks_fd)
        except (FileNotFoundError, NotALockFile):
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
        for name in sorted(os.listdir(locks_fd)):
            if not name.endswith(".lock") or name.startswith("."):
                continue
            rel = state.relpath_of_stamp(name[:-5])
            try:
                st = os.stat(name, dir_fd=locks_fd, follow_symlinks=False)
                if now - st.st_mtime < STALE_AFTER or os.path.lexists(self.root / rel):
                    continue
                if not stat.S_ISREG(st.st_mode):
                    continue  # a FIFO or device among the locks: not kcache's, never opened
                fd = open_lock(name, locks_fd)
            except OSError:
                continue
            try:
                if _flock(fd) and not os.path.lexists(self.root / rel):
                    fswrite.unlink_at(locks_fd, name)
            except OSError:
                pass
            finally:
                os.close(fd)


def _permission_fix(path: Path, exc: OSError, root: Path, rst: os.stat_result | None) -> str:
    """For a permission error: how to make the directory the group's (what a newer kcache run by its
    owner does by itself in a group-shared cache); in a user's own cache, a directory an older kcache run
    by root left root's, what gives it back (fswrite.give_back_state). `rst`: the fstat of the root held
    open (None when it is not)."""
    if exc.errno not in (errno.EACCES, errno.EPERM):
        return ""
    try:
        st = os.stat(path, follow_symlinks=False)
    except FileNotFoundError:  # it could not be made: the directory it goes in is the one to ask about
        path = path.parent
        try:
            st = os.stat(path, follow_symlinks=False)
        except OSError:
            return ""
    except OSError:
        return ""
    if st.st_mode & 0o020 and st.st_gid not in (os.getegid(), *os.getgroups()):  # the group's already: not ours
        return f"; {path} is the group {_group_name(st.st_gid)}'s, and you are not a member"
    if st.st_uid == 0 and rst is not None and rst.st_uid != 0 and not fswrite.group_shared(rst):
        cmd = shlex.join(["kcache", "--cache-dir", str(root), "prune", "--broken"])
        return (f"; fix: root runs any kcache command on this cache, e.g. `{cmd}`, which gives what an earlier "
                f"run of root's left root's in .kcache/ back to the cache's owner (uid {rst.st_uid})")
    return (f"; fix: its owner (uid {st.st_uid}) or root runs `chmod g+ws {path}` or any kcache prune or "
            "clear of this cache (which makes .kcache/ the group's)")


def _group_name(gid: int) -> str:
    try:
        import grp

        return grp.getgrgid(gid).gr_name
    except (KeyError, ImportError):
        return str(gid)


class _Deleter:
    """Empties the trash batch in worker threads while the main thread renames entries into it. Deleting
    is waiting on the disk (unlinks, rmdirs), and disks serve several at once: 4 threads delete about
    twice as fast as one (and than `rm -rf`) on the disks measured; see bench/bench_prune.py. Each
    works relative to the batch's descriptor (kcache_cli.fs.delete), never by path."""

    THREADS = 4

    def __init__(self, batch_fd: int, where: str, errors: list[tuple[str, str]]):

        self.batch_fd = batch_fd
        self.where = where
        self.errors = errors
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.threads = [threading.Thread(target=self._run, name=f"kcache-trash-{i}", daemon=True)
                        for i in range(self.THREADS)]
        for t in self.threads:
            t.start()

    def put(self, name: str, origin: str) -> None:
        self.queue.put((name, origin))

    def finish(self, abandon: bool = False, stop: Callable[[], bool] = lambda: False) -> None:
        """Wait for the threads; with `abandon` (or once `stop()` says so, a Ctrl-C while waiting), for the
        trees they are deleting only (what is still queued stays in the trash for the next run)."""
        if abandon:
            self._drain()
        for _ in self.threads:
            self.queue.put(None)
        for t in self.threads:
            while t.is_alive():
                t.join(0.1)
                if not abandon and stop():
                    abandon = True
                    self._drain()  # the end markers too: put back, one per thread
                    for _ in self.threads:
                        self.queue.put(None)

    def _drain(self) -> None:
        try:
            while True:
                self.queue.get_nowait()
        except queue.Empty:
            pass

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            name, origin = item
            done = fsdelete.remove_tree(self.batch_fd, name, label=f"{self.where}/{name}")
            if not done.gone:
                self.errors.append((origin, f"could not delete all of {origin} (moved to the trash; the next "
                                            f"prune retries): " + "; ".join(done.problems[:3])))


def _status_now(e: Entry, root: Path | None = None, deep: bool = True) -> str:
    """The entry's status read again now, by the same judgement (deep or cheap) that selected it."""
    if root is None:
        root = Path(e.path[: len(e.path) - len(e.relpath)] or "/")
    return verify.judge_entry(root, e, deep=deep).status


def _no_layout():

    class _Own(Layout):
        """kcache's own leftovers: no shape, no dependencies, nothing held."""

        shape = LayoutShape("kcache", (), "kcache's own leftovers")

    return _Own()


_NO_LAYOUT = _no_layout()
