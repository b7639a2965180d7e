"""`verify`: every selected entry against its layout's rules and any recorded checksums.

The deep checks are the layouts' own `describe()` (task.txt's hash against the directory name,
files against kcache.json or tilelang's manifest.json / metadata.json, tilus links); on top of
them an entry that is not complete is a problem (its reason). The status is the layout's one
judgement (`judge_entry`), the same that ls (cheaply), prune --broken and import go by. Entries
being built are left alone and counted."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from kcache_cli.catalog.scan import scan_cache
from kcache_cli.fs import delete as fsdelete
from kcache_cli.fs import read as fsread
from kcache_cli.fs.entrydir import EntryDir
from kcache_cli.layouts import get
from kcache_cli.model.records import (
    BUILDING,
    COMPLETE,
    CORRUPT,
    UNREADABLE,
    Entry,
    Judgement,
    ScanFilter,
    Status,
    Warn,
)
from kcache_cli.util.progress import NO_PROGRESS, Progress


@dataclass(frozen=True)
class EntryCheck:
    """One entry after the deep checks: its status, its problems, a relocation to fix."""

    entry: Entry
    status: Status  # after the deep checks (a complete entry that fails one is corrupt)
    problems: tuple[str, ...]
    # Where the entry's own files are fine but the paths it records point elsewhere (Triton's group
    # files after the cache moved): the layout's `relocation_problem`; `verify --fix` rewrites them.
    relocation: str | None = None

    def to_json(self) -> dict:
        """An `ls --json` row with the deep check's status, first problem as reason, and every problem."""
        return {**self.entry.to_json(), "status": self.status, "reason": self.problems[0] if self.problems else None,
                "problems": list(self.problems)}


@dataclass(frozen=True)
class VerifyResult:
    """What `kcache verify` checked, skipped and fixed in one root."""

    root: str
    exists: bool
    checked: tuple[EntryCheck, ...]
    skipped: tuple[Entry, ...]  # being built
    warnings: tuple[str, ...]
    fixed: tuple[EntryCheck, ...] = ()  # entries whose recorded paths --fix rewrote (problem gone)
    fix_errors: tuple[tuple[Entry, str], ...] = ()
    unlocked: int = 0  # of `fixed`, the entries whose left locks --fix removed (the rest: paths rewritten)
    unlisted: bool = False  # the root could not be listed: nothing in it was checked (a failure)
    unlock_notes: tuple[str, ...] = ()  # what those removals mean for the waiting processes (StaleLock.after)

    @property
    def failed(self) -> tuple[EntryCheck, ...]:
        return tuple(c for c in self.checked if c.problems)

    def to_json(self) -> dict:
        """`verify --json`: counts, the entries with problems, and what --fix's removals of left locks mean
        for the processes waiting on them (the note its text adds)."""
        failed = self.failed
        return {"root": self.root, "exists": self.exists, "checked": len(self.checked),
                "ok": len(self.checked) - len(failed), "failed": len(failed), "skipped_building": len(self.skipped),
                "fixed": [ch.entry.to_json() for ch in self.fixed], "problems": [ch.to_json() for ch in failed],
                "lock_removal_notes": list(self.unlock_notes)}


def judge_entry(root: Path, entry: Entry, deep: bool = True, *, caller_reads: bool = False) -> Judgement:
    """The layout's one judgement of `entry`'s files, read again now: what verify, inspect,
    prune --broken (also at delete time), import's "already present" and export all go by.
    Temp and staging directories, links where entries belong, unlistable directories, entries being
    built and directories not shaped like the tool's entries keep the scan's status: they are not
    entries a layout judges. The entry's directory is opened
    from the root held open (fsread.anchor) and handed to the layout with its judging context."""
    kept = not_judged(entry)
    if kept is not None:
        return kept
    with EntryDir.open(entry.path, fsread.anchor(root)) as d:
        return judge_open(entry, d, deep, caller_reads=caller_reads)


def not_judged(entry: Entry, opened: EntryDir | None = None) -> Judgement | None:
    """The scan's own status of an entry no layout judges (judge_entry's first rule), or None. `opened`:
    the entry's directory as the caller holds it (open, it is a directory and no link: not asked again)."""
    name = os.path.basename(entry.path)
    layout = get(entry.layout)
    hidden = name.startswith(".") and not layout.hidden_names  # a temp or staging directory (numba's: its shape)
    if (entry.status == BUILDING or not entry.hash or hidden or layout.leftover(entry) is not None
            or layout.shape_problem(entry.relpath, entry.kind, None) is not None):  # no entry of the tool's
        return Judgement.of(entry.status, entry.reason)
    if opened is not None and opened.fd is not None:
        return None
    if fsread.is_link(entry.path) or not fsread.is_dir(entry.path):
        return Judgement.of(entry.status, entry.reason)
    return None


def judge_open(entry: Entry, d: EntryDir, deep: bool = True, *, caller_reads: bool = False) -> Judgement:
    """judge_entry of an entry whose directory the caller opened as `d` (from the root's anchor), after
    not_judged said it is one to judge. Bytes the caller read through `d` already (`d.held`) are judged
    as they were read."""
    layout = get(entry.layout)
    try:
        verdict = layout.judge(d, entry.kind, layout.judging(deep, caller_reads=caller_reads))
        if verdict.status != COMPLETE and d.swapped:
            # A directory above the entry was a link while it was read: nothing is known of the entry,
            # and unreadable is a status prune never deletes.
            return Judgement.of(UNREADABLE, "a directory on the way to it was replaced by a link while it was read")
        return verdict
    except OSError as exc:
        status: Status = UNREADABLE if isinstance(exc, PermissionError) or d.swapped else CORRUPT
        return Judgement.of(status, f"cannot read the entry: {exc.strerror}")


def check_entry(root: Path, entry: Entry) -> EntryCheck:
    """The deep judgement (through the layout's describe, which also checks what it reads)."""
    try:
        details = get(entry.layout).describe(Path(root), entry)
    except OSError as exc:
        status: Status = UNREADABLE if isinstance(exc, PermissionError) else CORRUPT
        return EntryCheck(entry, status, (f"cannot read the entry: {exc.strerror}",))
    except RecursionError:  # a second net: the walks and JSON reads are bounded (fsread)
        return EntryCheck(entry, CORRUPT, ("nested too deeply to check",))
    problems = list(details.problems)
    if details.status != COMPLETE and details.reason and details.reason not in problems:
        problems.insert(0, details.reason)
    status = details.status
    if problems and status == COMPLETE:
        status = CORRUPT
    moved = get(entry.layout).relocation_problem(entry)
    if moved and moved not in problems:  # the files are whole: the status stays, the entry still fails
        problems.append(moved)
    return EntryCheck(entry, status, tuple(problems), moved)


def fix_relocation(root: Path, check: EntryCheck) -> tuple[EntryCheck, str | None]:
    """Rewrite the paths an entry records to where it lies now (the layout's `relocate`): the entry checked
    again (a moved Triton kernel was judged no further than its paths: what lies behind them, a truncated
    binary or a FIFO, shows only now), or the error that stopped it."""
    try:
        get(check.entry.layout).relocate(check.entry.path, check.entry.path, Path(root))
    except OSError as exc:
        return check, f"cannot rewrite {exc.filename or check.entry.path}: {exc.strerror or exc}"
    return check_entry(root, check.entry), None


def fix_stale_locks(root: Path, check: EntryCheck,
                    notes: list[str] | None = None) -> tuple[EntryCheck, str | None] | None:
    """Remove the lock files the entry's compiler left and no live process holds (the layout's
    `stale_locks`, asked again now from the entry's directory held open; each removed only while it is
    still the file judged stale; what each removal means for the waiting processes added to `notes`):
    the entry checked again, or the error that stopped it. None when it has no stale lock."""
    layout = get(check.entry.layout)
    with EntryDir.open(check.entry.path, fsread.anchor(root)) as d:
        if d.fd is None:
            return None
        stale = layout.stale_locks(d, layout.judging(deep=True))
        for lock in stale:
            try:
                fsdelete.remove_held_file(d.fd, lock.name, lock.seen)
            except OSError as exc:
                return check, f"cannot remove {lock.name}: {exc.strerror or exc}"
            if notes is not None and lock.after and lock.after not in notes:
                notes.append(lock.after)
    return (check_entry(root, check.entry), None) if stale else None


def verify_cache(root: Path, flt: ScanFilter = ScanFilter(), warn: Warn | None = None, progress=None,
                 fix: bool = False, scanning: Progress = NO_PROGRESS) -> VerifyResult:
    """Deep-check every entry `flt` selects. `progress` gets start(total entries) and advance(1);
    `scanning` counts the scan before (entries found and judged cheaply).
    With `fix`, entries whose recorded paths point elsewhere are rewritten (see fix_relocation), and lock
    files no live process holds are removed (see fix_stale_locks)."""
    result = scan_cache(Path(root), flt, warn, progress=scanning)
    todo = [e for e in result.entries if e.status != BUILDING]
    skipped = tuple(e for e in result.entries if e.status == BUILDING)
    if progress:
        progress.start(len(todo))
    checked = []
    fixed, errors = [], []
    unlocked, notes = 0, list[str]()
    for e in sorted(todo, key=lambda e: e.relpath):
        check = check_entry(root, e)
        unlocked_now = fix_stale_locks(root, check, notes) if fix and check.problems else None
        if unlocked_now is not None:
            check, error = unlocked_now
            (errors.append((e, error)) if error else fixed.append(check))
            unlocked += error is None
        if fix and check.relocation:
            check, error = fix_relocation(root, check)
            (errors.append((e, error)) if error else fixed.append(check))
        checked.append(check)
        if progress:
            progress.advance(1)
    return VerifyResult(result.root, result.exists, tuple(checked), skipped, result.warnings, tuple(fixed),
                        tuple(errors), unlocked, result.unlisted, tuple(notes))
